"""The history graphs' figures (btop's): host RAM and page cache, VRAM (the driver's and the
allocator's), GPU utilisation, power and temperature, the run's CPU, disk free and write rate.

While the trainer runs, the keeper takes one `VitalsSample` from its latest probe every `VITALS_S` and journals it
(`protocol.Vitals`), so the history is the journal's: every reader folds the same records
(`VitalsHistory.observe`) and a control room opened later, or after the keeper is gone, draws the
whole run. The store is bounded: the last hour at full resolution, older samples thinned by half
whenever it fills (a week-long run still draws its whole life, coarser the older it is).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainroom.core.run.state import RunState
from trainroom.core.samples import VitalsSample

VITALS_S = 5.0  # how often the keeper journals a sample
MAX_SAMPLES = 4096
RECENT_S = 3600.0  # never thinned


def vitals_of(st: RunState, t: float) -> VitalsSample | None:
    """The figures of the state's latest probe (None: no probe yet)."""
    probe = st.probe
    if probe is None:
        return None
    host, gpu, disk = probe.host, probe.gpu, probe.disk
    procs = probe.procs
    mem_used = None
    if host is not None and host.available and None not in (host.mem_total_bytes, host.mem_available_bytes):
        mem_used = (host.mem_total_bytes or 0) - (host.mem_available_bytes or 0)
    devices = gpu.devices if gpu is not None and gpu.available else []

    def total(values: Sequence[int | float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    def most(values: Sequence[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    vram = total([d.used_bytes for d in devices])
    vram_total = total([d.total_bytes for d in devices])
    power = total([d.power_w for d in devices])
    live = st.attempt is not None and st.attempt.alive
    ranks = list(st.ranks.values()) if live else []
    reserved = total([r.alloc_reserved for r in ranks])
    allocated = total([r.alloc_allocated for r in ranks])
    rows = procs.table if procs is not None and live else []
    cpu = total([r.cpu_percent for r in rows])
    written = total([r.write_bps for r in rows])
    return VitalsSample(
        t=t,
        mem_used_bytes=mem_used,
        mem_total_bytes=host.mem_total_bytes if host is not None else None,
        page_cache_bytes=host.page_cache_bytes if host is not None else None,
        vram_used_bytes=int(vram) if vram is not None else None,
        vram_total_bytes=int(vram_total) if vram_total is not None else None,
        alloc_reserved_bytes=int(reserved) if reserved is not None else None,
        alloc_allocated_bytes=int(allocated) if allocated is not None else None,
        gpu_util_percent=most([d.util_percent for d in devices]),
        gpu_power_w=round(power, 1) if power is not None else None,
        gpu_temp_c=most([d.temperature_c for d in devices]),
        cpu_percent=round(cpu, 1) if cpu is not None else None,
        disk_free_bytes=disk.free_bytes if disk is not None else None,
        disk_write_bps=round(written, 1) if written is not None else None,
    )


class VitalsHistory:
    """The samples in time order, bounded (see the module docstring)."""

    def __init__(self, samples: Sequence[VitalsSample] = ()) -> None:
        self.samples: list[VitalsSample] = sorted(samples, key=lambda v: v.t)
        self.version = 0  # moves whenever a sample is added (a view redraws only then)

    def add(self, v: VitalsSample) -> None:
        if self.samples and v.t < self.samples[-1].t:
            return  # a replay's duplicate: the history only moves forward
        self.samples.append(v)
        self.version += 1
        if len(self.samples) > MAX_SAMPLES:
            self._thin()

    def _thin(self) -> None:
        cut = self.samples[-1].t - RECENT_S
        old = [v for v in self.samples if v.t < cut]
        recent = self.samples[len(old) :]
        if len(old) < 2:  # all recent: drop the oldest
            self.samples = self.samples[-MAX_SAMPLES:]
            return
        self.samples = old[::2] + recent

    def window(self, seconds: float | None) -> list[VitalsSample]:
        """The samples of the last `seconds` (None: all), by the newest sample's time."""
        if seconds is None or not self.samples:
            return list(self.samples)
        cut = self.samples[-1].t - seconds
        return [v for v in self.samples if v.t >= cut]


class VitalsClock:
    """When the keeper next journals a sample: every VITALS_S of probe time."""

    def __init__(self, every_s: float = VITALS_S) -> None:
        self.every_s = every_s
        self._last: float | None = None

    def due(self, st: RunState) -> VitalsSample | None:
        probe = st.probe
        if st.attempt is None or not st.attempt.alive:
            return None  # a resting keeper (the trainer ended) journals nothing new
        if probe is None or (self._last is not None and probe.t - self._last < self.every_s):
            return None
        self._last = probe.t
        return vitals_of(st, probe.t)
