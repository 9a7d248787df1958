"""The kernel's word on a GPU: the NVIDIA driver's `NVRM: Xid (PCI:0000:3b:00): 79, ...` lines and
"GPU has fallen off the bus", parsed; the PCI bus id as one spelling; what each common Xid means
and what to do about it.

The catalogue follows NVIDIA's "XID Errors" documentation (https://docs.nvidia.com/deploy/xid-errors/,
the table of Xid codes and their likely causes, and the "Xid Catalog" of recommended actions in the
GPU deployment and management guide). Its actions are said in three words a person acts on:
restart the run (the application's own fault; the GPU is fine), reset the GPU (the driver or the
memory needs a reset: `nvidia-smi -r` with nothing on it, or a reboot), drain the node (the
hardware needs service: take it out of the scheduler, reseat or replace).

Parsing is linear on a bounded line (LINE_MAX characters): a kernel line is hostile data as much
as a trainer's is (a process can write any line to /dev/kmsg as root).
"""

from __future__ import annotations

import re
from typing import NamedTuple

LINE_MAX = 2048

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus." (older
# drivers: "NVRM: Xid (0000:3b:00): 13, ..."). Bounded repetitions only: linear on any line.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d{1,5})"
)
_PID = re.compile(r"\bpid=(\d{1,10})\b")
_BUS = re.compile(r"(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")
FELL_OFF = "fallen off the bus"
LOST_XIDS = frozenset({79})


class KernelGpuLine(NamedTuple):
    """One kernel line about a GPU: its bus (normalised), its Xid (None: a fall off the bus
    said without one), whether the GPU is lost, and the message (bounded)."""

    bus_id: str | None
    xid: int | None
    lost: bool
    text: str
    pid: int | None = None  # the process the driver names ("pid=1234"), newer drivers only


def norm_bus(raw: str | bytes | None) -> str | None:
    """One spelling of a PCI address: NVML's "00000000:3B:00.0", the kernel's "0000:3b:00" and
    "PCI:0000:3b:00.0" are all "0000:3b:00.0". None: not an address."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    text = text.strip().rstrip("\0")
    if text.upper().startswith("PCI:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    dev, _, fn = parts[2].partition(".")
    try:
        domain, bus, slot, func = int(parts[0], 16), int(parts[1], 16), int(dev, 16), int(fn or "0", 16)
    except ValueError:
        return None
    if not (0 <= domain <= 0xFFFFFFFF and 0 <= bus <= 0xFF and 0 <= slot <= 0x1F and 0 <= func <= 7):
        return None
    return f"{domain:04x}:{bus:02x}:{slot:02x}.{func}"


def parse_kernel_line(line: str) -> KernelGpuLine | None:
    """A kernel log line (a /dev/kmsg record "6,123,456,-;NVRM: ..." or a journalctl line
    "[  12.345] host kernel: NVRM: ...") about a GPU, or None. The facility is not read: a line
    injected from user space is as much the kernel's word to this reader."""
    line = line[:LINE_MAX]
    at = line.find("NVRM:")
    if at < 0:
        return None
    msg = line[at:].rstrip("\r\n")
    m = _XID.search(msg)
    if m is not None:
        xid = int(m.group(2))
        pid = _PID.search(msg, m.end())
        lost = xid in LOST_XIDS or FELL_OFF in msg
        return KernelGpuLine(norm_bus(m.group(1)), xid, lost, msg, int(pid.group(1)) if pid else None)
    if FELL_OFF in msg:
        b = _BUS.search(msg)
        return KernelGpuLine(norm_bus(b.group(1)) if b else None, None, True, msg)
    return None


Action = str  # "restart the run" | "reset the GPU" | "drain the node"
RESTART, RESET, DRAIN = "restart the run", "reset the GPU", "drain the node"


class XidKind(NamedTuple):
    meaning: str
    action: Action
    critical: bool  # the GPU itself is in doubt (else: the application's fault, the GPU fine)


# The common codes (NVIDIA's XID Errors table and Xid Catalog).
XIDS: dict[int, XidKind] = {
    13: XidKind("graphics engine exception (an illegal instruction or out-of-bounds access)", RESTART, False),
    31: XidKind("GPU memory page fault (an illegal memory access by the application)", RESTART, False),
    32: XidKind("invalid or corrupted push buffer stream (driver or PCIe trouble)", RESET, True),
    43: XidKind("GPU stopped processing: the application's channel was reset", RESTART, False),
    45: XidKind("preemptive cleanup: the driver ended the channel after an earlier error", RESTART, False),
    48: XidKind("double-bit ECC error: uncorrectable memory error", RESET, True),
    61: XidKind("internal micro-controller breakpoint/warning", RESET, True),
    62: XidKind("internal micro-controller halt", RESET, True),
    63: XidKind("ECC page retirement or row remapping recorded: applied at the next reset", RESET, True),
    64: XidKind("ECC page retirement or row remapper recording failure", DRAIN, True),
    68: XidKind("video processor (NVDEC) exception", RESTART, False),
    69: XidKind("graphics engine class error", RESTART, False),
    74: XidKind("NVLink error", RESET, True),
    79: XidKind("GPU has fallen off the bus", DRAIN, True),
    92: XidKind("high single-bit ECC error rate", DRAIN, True),
    94: XidKind("contained ECC error: the application that hit it was stopped", RESTART, True),
    95: XidKind("uncontained ECC error: every application on the GPU is affected", RESET, True),
    119: XidKind("GSP RPC timeout (the GPU's system processor did not answer)", RESET, True),
    120: XidKind("GSP error", RESET, True),
    121: XidKind("C2C (chip-to-chip) link error", RESET, True),
    140: XidKind("unrecovered ECC error", RESET, True),
}


def xid_kind(xid: int | None) -> XidKind:
    if xid is None:
        return XIDS[79]
    return XIDS.get(
        xid, XidKind(f"Xid {xid} (not in trainroom's catalogue: see NVIDIA's XID Errors table)", RESET, True)
    )
