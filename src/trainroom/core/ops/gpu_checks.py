"""`trainroom doctor`'s GPU health check for the host: the keeper's rules (health.gpufaults) over
every device NVML shows (ECC, pending retirements and remaps, throttling, the PCIe link), the Xids
the kernel's ring buffer still holds for those devices' buses, and where a keeper would read the
kernel's word from (/dev/kmsg, `journalctl -k`, or neither, and why)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable

from trainroom.core.findings import Finding
from trainroom.core.health.context import WatchContext
from trainroom.core.health.gpufaults import ecc_findings, link_findings, throttle_findings
from trainroom.core.ops.host_checks import Check
from trainroom.core.probes.gpuevents import KMSG
from trainroom.core.probes.xid import LINE_MAX, KernelGpuLine, parse_kernel_line, xid_kind
from trainroom.core.samples import GpuSample

MAX_RECORDS = 200_000  # the ring buffer is bounded; so is this read


def kernel_log_source(kmsg: str = KMSG, which: Callable[[str], str | None] = shutil.which) -> str:
    """What a keeper on this host reads Xids from, in words."""
    try:
        os.close(os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK))
        return kmsg
    except OSError as exc:
        why = f"{kmsg}: {exc.strerror or exc}"
    if which("journalctl"):
        return f"journalctl -k ({why})"
    return f"unavailable: {why}; no journalctl"


def past_gpu_lines(buses: set[str], kmsg: str = KMSG) -> list[KernelGpuLine]:
    """The kernel's GPU lines still in its ring buffer for these buses (oldest first)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    out: list[KernelGpuLine] = []
    try:
        for _ in range(MAX_RECORDS):
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EINVAL):
                    continue
                break
            if not data:
                break
            for line in data.split(b"\n"):
                got = parse_kernel_line(line[:LINE_MAX].decode("utf-8", "replace")) if line else None
                if got is not None and got.bus_id in buses:
                    out.append(got)
    finally:
        os.close(fd)
    return out


def check_gpu_health(sample: GpuSample | None, kmsg: str = KMSG) -> Check:
    source = kernel_log_source(kmsg)
    facts: dict[str, str | int | float | bool | None] = {"kernel_log": source}
    if sample is None or not sample.available or not sample.devices:
        return Check(
            name="gpu_health",
            status="ok",
            facts=facts,
            detail=f"no device to judge; a keeper reads Xids from {source}",
        )
    ctx = WatchContext(gpu=sample)
    found = [
        *ecc_findings(ctx, every=True),
        *throttle_findings(ctx, every=True),
        *link_findings(ctx, every=True),
    ]
    buses = {d.pci_bus_id for d in sample.devices if d.pci_bus_id}
    for line in past_gpu_lines(buses, kmsg):
        kind = xid_kind(line.xid)
        what = "fell off the bus" if line.lost else f"Xid {line.xid}: {kind.meaning}"
        found_line = f"{line.bus_id} {what} (still in the kernel's log): {kind.action}"
        if found_line not in [f.message for f in found]:
            found.append(_said(found_line))
    found += [
        _said(f"GPU {d.index} ({d.pci_bus_id}) is lost (NVML): drain the node")
        for d in sample.devices
        if d.lost
    ]
    facts |= {"devices": len(sample.devices), "findings": len(found)}
    if not found:
        return Check(
            name="gpu_health",
            status="ok",
            facts=facts,
            detail=f"{len(sample.devices)} device(s): no ECC error pending, no throttling, links at their max, "
            f"no Xid in the kernel's log for them; a keeper reads Xids from {source}",
        )
    return Check(
        name="gpu_health",
        status="degraded",
        facts=facts,
        detail="; ".join(f.message for f in found) + f"; a keeper reads Xids from {source}",
        fix="reset the GPU or drain the node as said before starting a run on it",
    )


def _said(message: str) -> Finding:
    return Finding(code="GPU_XID", severity="warning", message=message)
