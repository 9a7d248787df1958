"""The driver's view of a run's VRAM, for a kill to confirm it fell (a context can outlive its
process: scenario 10's 12 GB -> 400 MiB) and for a resume to refuse while it has not."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from trainroom.core.units import fmt_bytes

VramProbe = Callable[[], "int | None"]
Progress = Callable[[str], None]


def run_vram_probe(
    gpu_probe: Any, pids: Collection[int], devices: Collection[int] | None = None
) -> VramProbe:
    """A VramProbe over a GpuProbe (anything with `sample(our_pids) -> dict`, see probes/gpu.py).

    Where the driver reports per-process memory (and its PIDs are ours to see), the run's share
    is the memory of the run's pids plus contexts whose pid no longer exists here: a context that
    outlived its process is what still holds the memory after a kill (nvidia-smi's "[Not Found]").
    Where it does not (WSL2/WDDM, MIG, another PID namespace), it is the devices' used memory, as
    NVRx checks before a restart (scenario 10: 12 GB -> 400 MiB). None: the driver view is
    unavailable.
    """
    run_pids = set(pids)
    wanted = None if devices is None else set(devices)

    def probe() -> int | None:
        sample = gpu_probe.sample(run_pids)
        if not sample.available:
            return None
        if sample.per_process and sample.pid_namespace == "host":
            return sum(
                x.used_bytes or 0
                for x in sample.processes
                if (wanted is None or x.device in wanted) and (x.pid in run_pids or not x.exists)
            )
        used = [
            d.used_bytes
            for d in sample.devices
            if (wanted is None or d.index in wanted) and d.used_bytes is not None
        ]
        return sum(used) if used else None

    return probe


# --------------------------------------------------------------------------- helpers


def read_vram(vram_probe: VramProbe | None) -> int | None:
    if vram_probe is None:
        return None
    try:
        value = vram_probe()
    except Exception:  # one failing probe never breaks the kill; it reads as "unavailable"
        return None
    return None if value is None else int(value)


def wait_vram(
    vram_probe: VramProbe | None,
    before: int | None,
    tolerance_bytes: int,
    timeout_s: float,
    poll_s: float,
    say: Progress,
) -> tuple[bool | None, int | None, float]:
    """(released, last reading, seconds waited); released is None when the driver view is
    unavailable."""
    start = time.monotonic()
    value = read_vram(vram_probe) if vram_probe is not None else None
    if value is None:
        return None, None, 0.0
    announced = False
    while value is not None and value >= tolerance_bytes:
        waited = time.monotonic() - start
        if waited >= timeout_s:
            return False, value, waited
        if not announced:
            say(
                f"waiting for the driver to release VRAM: {fmt_bytes(value)} held, tolerance {fmt_bytes(tolerance_bytes)}"
            )
            announced = True
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
        value = read_vram(vram_probe)
    if value is None:
        return None, None, time.monotonic() - start
    return True, value, time.monotonic() - start
