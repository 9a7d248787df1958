"""The driver's view of a run's VRAM, for a kill to confirm it fell (a context can outlive its
process: scenario 10's 12 GB -> 400 MiB) and for a resume to refuse while it has not.

What the run holds is read on one of three bases, and every reading says which:

- `per-process`: the driver lists each compute process with its memory (and its PIDs are ours
  to see). The run holds the rows of its pids plus those of pids that no longer exist (a context
  that outlived its process, nvidia-smi's "[Not Found]"). An empty list means nothing of the run
  is held, whatever the device's floor: an idle H200 with persistence mode holds 615 MiB with no
  process at all, a desktop GPU its display's share.
- `floor`: no per-process memory (WSL2/WDDM, MIG, another PID namespace), but the devices' used
  memory was recorded just before the attempt started: the run holds what the devices hold above
  that floor.
- `device`: neither: the devices' used memory itself, judged against the absolute tolerance (as
  NVRx checks before a restart).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec

from trainroom.core.probes.gpu import PROCESSES_UNAVAILABLE
from trainroom.core.samples import GpuSample, VramFloor
from trainroom.core.units import fmt_bytes
from trainroom.core.vocab import VramBasis


class VramReading(msgspec.Struct, kw_only=True, frozen=True):
    """What the driver says the run holds, and on what basis."""

    bytes: int
    basis: VramBasis
    device_bytes: int | None = None  # the devices' used memory, every process's
    floor_bytes: int | None = None  # the floor recorded at launch (basis "floor")
    # Whose rows `bytes` counts, in words, when not the whole run's: "pid 4423" for a kill of one
    # finding's target (the rest of the run may well hold memory still, and the device with it).
    of: str = ""


VramProbe = Callable[[], "VramReading | int | None"]
Progress = Callable[[str], None]

BASIS_WORDS: dict[str, str] = {
    "per-process": "per-process rows (the driver lists each process's memory)",
    "floor": "the device's memory against the floor recorded at launch (no per-process memory here)",
    "device": "the device's used memory against the tolerance (no per-process memory, no floor recorded)",
}


def run_vram_probe(
    gpu_probe: Any,
    pids: Collection[int],
    devices: Collection[int] | None = None,
    *,
    floor: VramFloor | None = None,
    of: str = "",
) -> VramProbe:
    """A VramProbe over a GpuProbe (anything with `sample(our_pids) -> GpuSample`, see
    probes/gpu.py); `floor` is the attempt's, recorded at launch. None: the driver view is
    unavailable."""
    run_pids = set(pids)
    wanted = None if devices is None else set(devices)

    def probe() -> VramReading | None:
        sample: GpuSample = gpu_probe.sample(run_pids)
        if not sample.available:
            return None
        used = {
            d.index: d.used_bytes
            for d in sample.devices
            if (wanted is None or d.index in wanted) and d.used_bytes is not None
        }
        device_bytes = sum(used.values()) if used else None
        if _rows_tell(sample, gpu_probe, floor):
            held = sum(
                x.used_bytes or 0
                for x in sample.processes
                if (wanted is None or x.device in wanted) and (x.pid in run_pids or not x.exists)
            )
            return VramReading(bytes=held, basis="per-process", device_bytes=device_bytes, of=of)
        if device_bytes is None:
            return None
        base = _floor_of(floor, used)
        if base is not None:
            return VramReading(
                bytes=max(0, device_bytes - base), basis="floor", device_bytes=device_bytes, floor_bytes=base
            )
        return VramReading(bytes=device_bytes, basis="device", device_bytes=device_bytes)

    return probe


def _rows_tell(sample: GpuSample, gpu_probe: Any, floor: VramFloor | None) -> bool:
    """Whether the driver's process rows say what the run holds: it gives per-process memory
    (in this sample, or it has before: an empty list after a kill is then "nobody"), the list
    itself was read, and its PIDs are ours to see."""
    if sample.pid_namespace != "host":
        return False
    if sample.per_process is False:
        return False
    if any(PROCESSES_UNAVAILABLE in n for n in sample.notes):
        return False
    return bool(
        sample.per_process
        or getattr(gpu_probe, "reports_per_process", False)
        or (floor is not None and floor.per_process)
    )


def _floor_of(floor: VramFloor | None, used: Collection[int]) -> int | None:
    """The recorded floor of the devices read now; None when any of them has none."""
    if floor is None or not used:
        return None
    total = 0
    for index in used:
        base = floor.used_bytes[index] if 0 <= index < len(floor.used_bytes) else None
        if base is None:
            return None
        total += base
    return total


# --------------------------------------------------------------------------- helpers


def read_reading(vram_probe: VramProbe | None) -> VramReading | None:
    """One reading; a probe that returns a bare byte count reads on the `device` basis."""
    if vram_probe is None:
        return None
    try:
        value = vram_probe()
    except Exception:  # one failing probe never breaks the kill; it reads as "unavailable"
        return None
    if value is None:
        return None
    if isinstance(value, VramReading):
        return value
    return VramReading(bytes=int(value), basis="device", device_bytes=int(value))


def read_vram(vram_probe: VramProbe | None) -> int | None:
    """What the run holds, in bytes (None: unavailable)."""
    reading = read_reading(vram_probe)
    return None if reading is None else reading.bytes


def wait_vram(
    vram_probe: VramProbe | None,
    before: int | None,
    tolerance_bytes: int,
    timeout_s: float,
    poll_s: float,
    say: Progress,
    stop: threading.Event | None = None,
) -> tuple[bool | None, VramReading | None, float]:
    """(released, last reading, seconds waited); released is None when the driver view is
    unavailable. Released: what the run holds, on the reading's basis, is under the tolerance.
    Each poll says the seconds left; `stop` set ends the wait at once (not released, yet)."""
    start = time.monotonic()
    stop = stop or threading.Event()
    reading = read_reading(vram_probe)
    if reading is None:
        return None, None, 0.0
    while reading is not None and reading.bytes >= tolerance_bytes:
        waited = time.monotonic() - start
        if waited >= timeout_s or stop.is_set():
            return False, reading, waited
        say(
            f"waiting for the driver to release VRAM: {fmt_bytes(reading.bytes)} held "
            f"({reading.basis}), tolerance {fmt_bytes(tolerance_bytes)}; "
            f"{max(timeout_s - waited, 0.0):.0f} s left"
        )
        if stop.wait(min(poll_s, max(0.0, timeout_s - waited))):
            return False, reading, time.monotonic() - start
        reading = read_reading(vram_probe)
    if reading is None:
        return None, None, time.monotonic() - start
    return True, reading, time.monotonic() - start


def released_words(reading: VramReading) -> str:
    """How the release was judged, in words, with the figures the basis rests on."""
    if reading.basis == "per-process":
        device = fmt_bytes(reading.device_bytes, unknown="n/a")
        if reading.bytes == 0 and reading.of:
            # Not "no process of the run": the run's other processes may be listed still.
            return f"on per-process rows: the driver lists {reading.of} no more (the device {device}, with what it still lists)"
        if reading.bytes == 0:
            return f"on per-process rows: the driver lists no process of the run (the device's {device} is its own floor)"
        if reading.of:
            return (
                f"on per-process rows: {reading.of} and contexts left behind hold {fmt_bytes(reading.bytes)} "
                f"(the device {device})"
            )
        return f"on per-process rows: the run's rows hold {fmt_bytes(reading.bytes)} (the device {device})"
    if reading.basis == "floor":
        return (
            f"against the floor recorded at launch: the device holds {fmt_bytes(reading.device_bytes)}, "
            f"its floor {fmt_bytes(reading.floor_bytes)} (no per-process memory here)"
        )
    return f"on the device's used memory, {fmt_bytes(reading.device_bytes)} (no per-process memory, no floor recorded)"
