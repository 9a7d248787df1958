"""The figures every reader shows, derived once from the run (`RunState`, plus a clock): the step
interval and the stall bound it gives, the step age, steps/s, the VRAM the run owns against what
its allocator reserves, the headline loss, ln V.

The watchdog judges by these same functions (STALLED against `progress_bound`, GHOST_MEMORY
against `vram_figures`, WHITE_MODEL against `ln_v`), `status` prints them and the control room
draws them, so a panel can never show a bound or a ratio the rules did not use. They live in the
run layer, below the rules, because `status` (run/status.py) reads them too. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.run.parts import RankView, StepRow
from trainroom.core.run.state import RunState
from trainroom.core.samples import GpuSample
from trainroom.core.vocab import VramBasis

# --------------------------------------------------------------------------- loss


def ln_v(vocab_size: int | None) -> float | None:
    """The uniform-guess loss ln V in nats; None when V is unknown (or nonsense)."""
    if vocab_size is None or vocab_size < 2:
        return None
    return math.log(vocab_size)


class HeadlineLoss(NamedTuple):
    """The median loss across ranks with the worst rank beside it, never only the mean (one failed
    rank of 64 moves the mean by half a nat and hides)."""

    median: float | None
    worst_rank: int | None
    worst: float | None


def headline_loss(per_rank: Mapping[int, float | None]) -> HeadlineLoss:
    """A non-finite loss is the worst there is (the lowest such rank); the median is taken over
    the finite ones (NaN when there are none)."""
    vals = {r: v for r, v in per_rank.items() if v is not None}
    if not vals:
        return HeadlineLoss(None, None, None)
    good = [v for v in vals.values() if math.isfinite(v)]
    med = statistics.median(good) if good else math.nan
    worst_rank = max(
        vals, key=lambda r: (not math.isfinite(vals[r]), vals[r] if math.isfinite(vals[r]) else 0.0, -r)
    )
    return HeadlineLoss(med, worst_rank, vals[worst_rank])


def run_loss(run: RunState) -> HeadlineLoss:
    """The headline loss of the current attempt's ranks."""
    return headline_loss({r.rank: r.loss for r in run.ranks.values()})


# --------------------------------------------------------------------------- cadence and bounds


def _intervals_of(rows: Iterable[StepRow]) -> list[float]:
    out: list[float] = []
    last_t = last_step = None
    for r in sorted(rows, key=lambda r: r.t):
        if last_t is not None and last_step is not None and r.step > last_step:
            out.append(max(0.0, r.t - last_t))
        last_t, last_step = r.t, r.step
    return out


def median_interval(run: RunState, th: Thresholds) -> float | None:
    """The run's step interval: the slowest rank of this attempt once it has enough intervals,
    else the previous attempt's (a resume steps as fast as the run did), else None."""
    meds = [
        statistics.median(r.intervals) for r in run.ranks.values() if len(r.intervals) >= th.min_intervals
    ]
    if meds:
        return max(meds)
    a = run.attempt
    if a is None:
        return None
    earlier = [s for s in run.recent_steps if s.attempt < a.n]
    if not earlier:
        return None
    n = max(s.attempt for s in earlier)
    rows = [s for s in earlier if s.attempt == n]
    meds = []
    for rank in {s.rank for s in rows}:
        iv = _intervals_of(s for s in rows if s.rank == rank)
        if len(iv) >= th.min_intervals:
            meds.append(statistics.median(iv))
    return max(meds) if meds else None


def progress_bound(median: float | None, th: Thresholds) -> float | None:
    """How long a step may take before it is a stall: max(stall_factor x median, stall_floor_s);
    None until the median is known."""
    return None if median is None else max(th.stall_factor * median, th.stall_floor_s)


def warmup_bound(th: Thresholds) -> float:
    """The wait for the first steps (imports, compile, data), before any median is known."""
    return max(th.start_grace_s, th.stall_floor_s)


def phase_bound(rank: RankView, th: Thresholds) -> float | None:
    """How long the rank's current phase may last (its Phase message's bound, else the configured
    one); None while it trains."""
    if rank.phase == "train":
        return None
    if rank.phase_bound_s is not None:
        return rank.phase_bound_s
    return th.phase_bounds_s.get(rank.phase, max(th.phase_bounds_s.values(), default=th.start_grace_s))


def step_bound(run: RunState, th: Thresholds | None = None) -> float:
    """The bound a step gap is judged against now: the progress bound once the median is known,
    the warm-up bound before."""
    th = th if th is not None else run.thresholds
    bound = progress_bound(median_interval(run, th), th)
    return bound if bound is not None else warmup_bound(th)


def stall_bound(run: RunState) -> tuple[float, str]:
    """The bound the age of the last step is drawn against, and the phase it is for: the step
    bound while training, the longest bound of a phase a rank is in (never shorter than the step
    bound). By the thresholds the keeper journaled."""
    th = run.thresholds
    bound, phase = step_bound(run, th), "train"
    for r in run.ranks.values():
        pb = phase_bound(r, th)
        if pb is not None:
            bound, phase = max(bound, pb), r.phase
    return bound, phase


def step_age(run: RunState, now: float) -> float | None:
    """How long ago the last step came, as of `now` while the attempt lives and as of its end
    after (a dead run's age does not grow); None before any step."""
    last = run.last_step_t()
    if last is None:
        return None
    a = run.attempt
    ref = a.ended_at if a is not None and a.ended_at is not None else now
    return max(0.0, ref - last)


# The records a rank's steps/s is read over (the newest of this attempt's recent steps).
RATE_RECORDS = 32
# The trainer's own pace is taken from one of a rank's newest records this many.
TIMED_RECENT = 4


class Pace(NamedTuple):
    """Steps a second and where the figure came from: `reporter` (an instrumented run's step
    times), the trainer's own timing on its log lines (`iteration times`, `bar rate`,
    `timestamps`: core/logs/logtiming), or `read times` (when the keeper read the log's lines)."""

    steps_per_s: float | None
    source: str | None


def _rank_pace(rows: list[StepRow], instrumented: bool) -> Pace | None:
    """One rank's pace since the step last went back (a restart): the trainer's own pace over its
    last records (core/logs/logtiming) where one of its newest records has it (the last step of an
    attempt may come from no line: HF's dict given out at the end); else the steps between its
    first and last record over the time between them, each arrival time counted once with the
    highest step it brought (a block-buffered stdout brings a hundred lines at one read time)."""
    rows = sorted(rows, key=lambda s: s.t)
    start = max((i for i in range(1, len(rows)) if rows[i].step < rows[i - 1].step), default=0)
    rows = rows[start:]
    # Only a log step's (an instrumented attempt's steps are its reporter's, whatever they say).
    recent = [] if instrumented else rows[-TIMED_RECENT:]
    timed = next((s for s in reversed(recent) if s.rate is not None and s.rate_from), None)
    if timed is not None and timed.rate is not None:
        return Pace(timed.rate, timed.rate_from)
    arrivals: dict[float, int] = {}
    for s in rows:
        arrivals[s.t] = max(arrivals.get(s.t, s.step), s.step)
    points = sorted(arrivals.items())[-RATE_RECORDS:]
    if len(points) >= 3 and points[-1][0] > points[0][0] and points[-1][1] > points[0][1]:
        rate = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
        return Pace(rate, "reporter" if instrumented else "read times")
    return None


def pace(run: RunState) -> Pace:
    """Steps a second at the pace of the slowest rank of this attempt (a log that prints every 10th
    step covers 10 steps a record), with its source; else 1 / the median record interval."""
    a = run.attempt
    if a is None:
        return Pace(None, None)
    by_rank: dict[int, list[StepRow]] = {}
    for s in run.recent_steps:
        if s.attempt == a.n:
            by_rank.setdefault(s.rank, []).append(s)
    paces = [p for rows in by_rank.values() if (p := _rank_pace(rows, a.instrumented)) is not None]
    if paces:
        return min(paces, key=lambda p: p.steps_per_s or 0.0)
    interval = run.step_interval()
    if not interval:
        return Pace(None, None)
    return Pace(1.0 / interval, "reporter" if a.instrumented else "read times")


def steps_per_s(run: RunState) -> float | None:
    """Steps a second (`pace`'s figure)."""
    return pace(run).steps_per_s


# --------------------------------------------------------------------------- VRAM


class VramFigures(msgspec.Struct, kw_only=True, frozen=True):
    """The driver's view of the run's VRAM beside what its allocator reports."""

    available: bool  # the driver view is there
    reason: str = ""  # why not: "no probe yet", "driver view unavailable: ..."
    device: str = ""  # the first device's name, "(+N)" for more
    per_process: bool = False  # the driver gives per-process memory (not WSL2/WDDM, not MIG)
    used_bytes: int | None = None  # device memory used, every process
    total_bytes: int | None = None
    # What the driver attributes to the run's processes, where it reports every one of them.
    run_bytes: int | None = None
    # The VRAM the run owns: run_bytes where the driver reports it, else the devices' used memory
    # less what other live processes are known to hold. What GHOST_MEMORY compares.
    owned_bytes: int | None = None
    basis: VramBasis | None = None
    devices: list[int] = []  # the devices owned_bytes covers
    util_percent: int | None = None  # the busiest device (junk over 100 is dropped)
    power_w: float | None = None  # all devices together
    allocated_bytes: int | None = None  # the allocator, summed over the ranks
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    ratio: float | None = None  # owned over reserved


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _owned(gpu: GpuSample) -> tuple[int | None, VramBasis | None, list[int]]:
    ours = gpu.ours
    known = [x.used_bytes for x in ours if x.used_bytes is not None]
    if ours and len(known) == len(ours):
        return sum(known), "per-process", sorted({x.device for x in ours})
    used = [d for d in gpu.devices if d.used_bytes is not None]
    if not used:
        return None, None, []
    # Other live processes' memory, where the driver does say it, is theirs, not the run's.
    others = sum(x.used_bytes for x in gpu.processes if not x.ours and x.exists and x.used_bytes is not None)
    return max(0, sum(d.used_bytes or 0 for d in used) - others), "device", [d.index for d in used]


def vram_figures(gpu: GpuSample | None, ranks: Iterable[RankView]) -> VramFigures:
    ranks = list(ranks)
    allocated = _sum(r.alloc_allocated for r in ranks)
    reserved = _sum(r.alloc_reserved for r in ranks)
    peak = _sum(r.alloc_peak for r in ranks)
    if gpu is None or not gpu.available:
        return VramFigures(
            available=False,
            reason="no probe yet" if gpu is None else (gpu.reason or "driver view unavailable"),
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            peak_bytes=peak,
        )
    owned, basis, devices = _owned(gpu)
    utils = [d.util_percent for d in gpu.devices if d.util_percent is not None and d.util_percent <= 100]
    powers = [d.power_w for d in gpu.devices if d.power_w is not None]
    name = (gpu.devices[0].name or "") if gpu.devices else ""
    if len(gpu.devices) > 1:
        name += f" (+{len(gpu.devices) - 1})"
    return VramFigures(
        available=True,
        device=name,
        per_process=bool(gpu.per_process),
        used_bytes=_sum(d.used_bytes for d in gpu.devices),
        total_bytes=_sum(d.total_bytes for d in gpu.devices),
        run_bytes=owned if basis == "per-process" else None,
        owned_bytes=owned,
        basis=basis,
        devices=devices,
        util_percent=max(utils) if utils else None,
        power_w=sum(powers) if powers else None,
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        peak_bytes=peak,
        ratio=owned / reserved if owned is not None and reserved else None,
    )


def vram(run: RunState) -> VramFigures:
    """The run's VRAM figures from its driver view (`driver_view`). An allocator figure belongs to
    a live attempt: once it ended, the allocator side (and the ratio against it) is unknown, not
    the dead trainer's last report set against whatever the device holds now (the journal keeps
    those last values)."""
    a = run.attempt
    ranks = run.ranks.values() if a is not None and a.alive else ()
    return vram_figures(driver_view(run), ranks)


def driver_view(run: RunState) -> GpuSample | None:
    """The latest probe's GPU sample, as a kill done since it was taken left it: the kill read
    the driver itself when it ended (its `after`), so until the next probe a process it ended is
    not shown holding memory the result says was released. Released on per-process rows (none of
    its rows listed any more): its processes' rows and the contexts left behind are dropped, and
    a single device's used memory is the kill's reading. Not released: its processes are gone
    (their memory is not): their rows say so."""
    gpu = run.probe.gpu if run.probe is not None else None
    if gpu is None or not gpu.available:
        return gpu
    for act in run.actions:
        if act.action != "kill" or act.t <= gpu.t or not act.before.get("pids"):
            continue
        ended = set(act.before.get("pids") or ()) - set(act.after.get("pids") or ())
        released = act.after.get("vram_basis") == "per-process" and act.after.get("vram_bytes") == 0
        if released:
            rows = [x for x in gpu.processes if x.pid not in ended and x.exists]
        else:
            rows = [msgspec.structs.replace(x, exists=False) if x.pid in ended else x for x in gpu.processes]
        devices = gpu.devices
        device_bytes = act.after.get("vram_device_bytes")
        if released and len(devices) == 1 and isinstance(device_bytes, int):
            devices = [msgspec.structs.replace(devices[0], used_bytes=device_bytes)]
        gpu = msgspec.structs.replace(gpu, processes=rows, devices=devices)
    return gpu
