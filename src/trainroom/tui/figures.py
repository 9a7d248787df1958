"""What each panel shows, computed from the run's state and a clock: pure, no Textual.

Every panel of the control room displays one frozen view built here. The app builds them all
under the reader's lock ten times a second at most, then hands each to its widget; a widget only
renders its view. Nothing here decides a verdict: the watchdog's state and its findings are the
judgement, and a view only picks the level (ok / warn / crit) a figure is drawn at from them.

The figures come from core, computed once (`core.run.figures`: the stall bound the watchdog
judges by, the step age, steps/s, the VRAM the run owns, the headline loss, ln V) and read from
the typed probe samples (`core.samples`); a view only arranges them. The loss plot's points are
`lossplot`'s.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from trainroom.core.findings import SEVERITY_RANK, Finding
from trainroom.core.run.ended import attempt_ended
from trainroom.core.run.figures import driver_view, ln_v, pace, run_loss, stall_bound, step_age, vram
from trainroom.core.run.series import SeriesSnapshot
from trainroom.core.run.state import RunState
from trainroom.core.vocab import PANEL_CODES, CkptState, FindingCode, Level

from . import fmt
from .lossplot import Mark, plot_points

SPARK_POINTS = 64
# States in which the trainer lives but does not step: its last rate is history, not a figure.
HALTED = ("stalled", "hung")


_LEVEL_OF_RANK: dict[int, Level] = {-1: "ok", 0: "info", 1: "warn", 2: "crit"}


def _worst_level(findings: Iterable[Finding]) -> Level:
    worst = -1
    for f in findings:
        worst = max(worst, SEVERITY_RANK.get(f.severity, 0))
    return _LEVEL_OF_RANK[worst]


def _findings(state: RunState, *codes: FindingCode) -> list[Finding]:
    return [f for f in state.findings.values() if f.code in codes]


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


# --------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class TrainerView:
    pid: int | None
    pgid: int | None
    alive: bool
    uptime_s: float | None
    exit_text: str
    exit_level: Level
    telemetry: str  # "reporter" | "log lines" | "waiting" (nothing heard yet) | "unrecognised" | "none"
    command: str
    crash: str | None  # the innermost error of the attempt's crash chain
    resume_from: str | None


def trainer_view(state: RunState, now: float) -> TrainerView:
    a = state.attempt
    if a is None:
        return TrainerView(
            None, None, False, None, "no attempt yet", "dim", "none", " ".join(state.argv), None, None
        )
    level: Level
    # An attached trainer ran before trainroom came: its life is its process's, not the watch's.
    began = a.start_time if a.attached and a.start_time > 0 else a.started_at
    if a.alive and state.status in HALTED:
        # Alive but not stepping: never "running" beside a rate that stopped moving.
        age = step_age(state, now)
        since = f"last step {fmt.duration(age)} ago" if age is not None else "no step yet"
        exit_text, level, uptime = f"{state.status}: {since}", "crit", now - began
    elif a.alive:
        exit_text, level, uptime = "running", "ok", now - began
    else:
        uptime = (a.ended_at or now) - began
        # In the words every reader uses (run.ended); a death, an error or a failed exit in red.
        exit_text = attempt_ended(a)
        failed = a.error or a.exit_signal is not None or a.exit_code
        level = "crit" if failed else "dim"
    crash = None
    if a.crash is not None and a.crash.chain:
        inner = a.crash.chain[-1]
        errno = f"[{inner.errno_name or 'Errno'} {inner.errno}] " if inner.errno is not None else ""
        crash = f"{inner.type}: {errno}{inner.message}"
        if len(a.crash.chain) > 1:
            crash += f" (under {a.crash.chain[0].type})"
    # The interpreter by its name, not its path: what tells two runs apart is the script.
    argv = [os.path.basename(a.argv[0]), *a.argv[1:]] if a.argv else []
    return TrainerView(
        pid=a.pid,
        pgid=a.pgid,
        alive=a.alive,
        uptime_s=float(round(uptime)),
        exit_text=exit_text,
        exit_level=level,
        telemetry=_telemetry(state),
        command=" ".join(argv),
        crash=crash,
        resume_from=a.resume_from,
    )


def _telemetry(state: RunState) -> str:
    """How the trainer is heard: before its reporter's Hello or a first log-line step it is
    neither (a trainer that imports torch says nothing for seconds), not "uninstrumented"."""
    a = state.attempt
    if a is None:
        return "none"
    if a.instrumented:
        return "reporter"
    if a.last_step is not None:
        return "log lines"
    if state.log_unread_lines:
        return "unrecognised"  # the log was read: nothing in it is a step (--log-pattern)
    return "waiting" if a.alive else "none"


# --------------------------------------------------------------------------- VRAM


@dataclass(frozen=True)
class GpuProcessRow:
    """One compute process the driver lists (the zoomed VRAM panel's table, as nvitop's first
    screen): whose it is, and what the driver says it holds."""

    pid: int
    device: int
    who: str  # "this run · rank 0", "this run", "another process", "gone: memory left behind"
    used_bytes: float | None  # None: the driver gives no per-process figure (WSL2, MIG)
    ours: bool
    gone: bool


@dataclass(frozen=True)
class VramView:
    driver_ok: bool
    driver_reason: str  # why the driver view is unavailable ("" when it is there)
    device: str
    driver_used: float | None  # device memory used, all processes
    driver_total: float | None
    run_bytes: float | None  # what the driver attributes to this run's processes
    per_process: bool  # False: the driver gives no per-process figure (WSL2, MIG)
    alloc_allocated: float | None
    alloc_reserved: float | None
    alloc_peak: float | None
    ratio: float | None  # driver-attributed (or device used) over allocator reserved
    util_percent: float | None
    power_w: float | None
    level: Level
    processes: tuple[GpuProcessRow, ...] = ()  # the run's first, then the most memory first


def gpu_process_rows(state: RunState) -> tuple[GpuProcessRow, ...]:
    """Every process the GPU probe listed: the run's own first (by rank), then the rest by the
    memory they hold. A rank is named from the reporter's pids and the workers the probe saw."""
    gpu = driver_view(state)  # as a kill done since the sample left it: the result's own reading
    if gpu is None or not gpu.available:
        return ()
    rank_of = {w.pid: w.rank for w in state.workers.values()}
    rank_of.update({r.pid: r.rank for r in state.ranks.values() if r.pid})
    rows = []
    for x in gpu.processes:
        rank = rank_of.get(x.pid)
        if x.gone:
            who = "gone: memory left behind"
        elif x.ours:
            who = f"this run · rank {rank}" if rank is not None else "this run"
        else:
            who = "another process"
        used = float(x.used_bytes) if x.used_bytes is not None else None
        rows.append(GpuProcessRow(x.pid, x.device, who, used, x.ours, x.gone))
    rows.sort(key=lambda r: (not r.ours, -(r.used_bytes or 0.0), r.pid))
    return tuple(rows)


_VENDOR_WORDS = ("NVIDIA ", "GeForce ", "Tesla ", "Quadro ")


def vram_title(total: float | None, device: str, width: int) -> str:
    """The VRAM panel's title in `width` columns: the total and the device, the vendor's words
    dropped first and then the middle of the name, never its end ("(fake)", "(+1)": what the
    figures are of)."""
    head = "VRAM" + (f" {fmt.nbytes(total)}" if total is not None else "")
    if not device:
        return head
    name = device
    for word in _VENDOR_WORDS:
        if len(f"{head} · {name}") <= width:
            break
        name = name.replace(word, "")
    room = width - len(f"{head} · ")
    if len(name) > room:
        tail = name[name.rfind(" (") :] if name.endswith(")") and " (" in name else ""
        keep = room - len(tail) - 1
        if keep < 3:
            return f"{head} · {tail.strip()}" if tail and len(f"{head} · {tail.strip()}") <= width else head
        name = name[: len(name) - len(tail)][:keep].rstrip() + "…" + tail
    return f"{head} · {name}"


def vram_view(state: RunState) -> VramView:
    v = vram(state)
    return VramView(
        driver_ok=v.available,
        driver_reason=v.reason.removeprefix("driver view unavailable: "),
        device=v.device,
        driver_used=v.used_bytes,
        driver_total=v.total_bytes,
        run_bytes=v.run_bytes,
        per_process=v.per_process,
        alloc_allocated=v.allocated_bytes,
        alloc_reserved=v.reserved_bytes,
        alloc_peak=v.peak_bytes,
        ratio=v.ratio,
        util_percent=v.util_percent,
        power_w=v.power_w,
        level=_worst_level(_findings(state, *PANEL_CODES["vram"])),
        processes=gpu_process_rows(state),
    )


# --------------------------------------------------------------------------- cadence


@dataclass(frozen=True)
class CadenceView:
    steps_per_s: float | None
    interval_s: float | None  # median step interval of the slowest rank
    tokens_per_s: float | None
    last_step_age_s: float | None
    bound_s: float  # the watchdog's stall bound the age is drawn against (or the current phase's own)
    phase: str
    stopped: bool  # the attempt ended: the age no longer grows
    halted: str  # "stalled" or "hung" while alive but not stepping (the rates are the last seen), else ""
    intervals: tuple[float, ...]
    level: Level
    rate_from: str | None = None  # where steps/s came from (core/run/figures.Pace's source)


def cadence_view(state: RunState, now: float) -> CadenceView:
    a = state.attempt
    stopped = a is None or not a.alive
    age = step_age(state, now)
    age = round(age, 1) if age is not None else None  # tenths: what the panel shows
    ranks = list(state.ranks.values())
    pacing = max(ranks, key=lambda r: r.median_interval or 0.0, default=None)
    intervals = tuple(pacing.intervals[-SPARK_POINTS:]) if pacing is not None else ()
    bound, phase = stall_bound(state)
    tps = [r.tokens_per_s for r in ranks if r.tokens_per_s is not None]
    level: Level
    if state.status in ("stalled", "hung", "dead"):
        level = "crit"
    elif state.status == "slow" or (age is not None and not stopped and age > bound / 2):
        level = "warn"
    elif stopped:
        level = "dim"
    else:
        level = "ok"
    rate, source = pace(state)
    interval = state.step_interval()
    if rate and source not in (None, "reporter"):
        interval = 1.0 / rate  # a log record may cover many steps: its gap is not one step's
    return CadenceView(
        steps_per_s=rate,
        interval_s=interval,
        tokens_per_s=sum(tps) if tps else None,
        last_step_age_s=age,
        bound_s=bound,
        phase=phase,
        stopped=stopped,
        halted=state.status if not stopped and state.status in HALTED else "",
        intervals=intervals,
        level=level,
        rate_from=source if rate else None,
    )


# --------------------------------------------------------------------------- LR


@dataclass(frozen=True)
class LrGroup:
    group: int
    effective: float
    ratio: float | None  # effective over requested


@dataclass(frozen=True)
class LrView:
    requested: float | None
    groups: tuple[LrGroup, ...]
    warmup_steps: int | None
    level: Level
    finding: str | None  # the LR_MISMATCH message, when one is open


def lr_view(state: RunState) -> LrView:
    a = state.attempt
    requested = a.requested.lr if a is not None else None
    ranks = sorted(state.ranks.values(), key=lambda r: r.rank)
    lrs = next((r.lr for r in ranks if r.lr), [])
    groups = tuple(LrGroup(i, x, x / requested if requested else None) for i, x in enumerate(lrs))
    mismatch = _findings(state, *PANEL_CODES["lr"])
    return LrView(
        requested=requested,
        groups=groups,
        warmup_steps=a.requested.warmup_steps if a is not None else None,
        level=_worst_level(mismatch) if mismatch else ("ok" if groups else "dim"),
        finding=mismatch[0].message if mismatch else None,
    )


# --------------------------------------------------------------------------- loss


@dataclass(frozen=True)
class LossView:
    points: tuple[tuple[float, float], ...]  # (tokens or step, loss), finite losses only
    x_label: str  # "tokens" or "step"
    ln_v: float | None
    vocab_size: int | None
    marks: tuple[Mark, ...]
    median: float | None  # the headline: median across ranks, with the worst rank beside it
    worst_rank: int | None
    worst: float | None
    ranks: int
    level: Level
    curve: str = "median"  # whose loss the curve is: "rank 0" or the ranks' "median"
    curve_last: float | None = None  # where the curve ends: the headline beside it says this figure
    evals: tuple[tuple[float, float], ...] = ()  # each promoted checkpoint's evaluation figure


def loss_view(state: RunState, series: SeriesSnapshot | None = None) -> LossView:
    a = state.attempt
    vocab = a.requested.vocab_size if a is not None else None
    baseline = ln_v(vocab)
    if baseline is None and series is not None:
        baseline = series.loss_baseline
    plot = plot_points(state, series)
    median, worst_rank, worst = run_loss(state)
    return LossView(
        points=plot.points,
        x_label=plot.x_label,
        ln_v=baseline,
        vocab_size=vocab,
        marks=plot.marks,
        median=median,
        worst_rank=worst_rank,
        worst=worst,
        ranks=len(state.ranks),
        level=_worst_level(_findings(state, *PANEL_CODES["loss"])),
        curve=plot.source,
        curve_last=plot.points[-1][1] if plot.points else None,
        evals=plot.evals,
    )


# --------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class RankRow:
    rank: int
    step: int | None
    loss: float | None
    interval_s: float | None
    tokens_per_s: float | None
    alloc_reserved: float | None
    connected: bool
    outlier: bool


@dataclass(frozen=True)
class RanksView:
    rows: tuple[RankRow, ...]  # outliers first, then by rank
    median_loss: float | None
    worst_rank: int | None
    worst_loss: float | None
    median_interval_s: float | None
    slowest_rank: int | None
    slowest_interval_s: float | None


def ranks_view(state: RunState) -> RanksView:
    outliers: set[int] = set()
    for f in _findings(state, "RANK_OUTLIER"):
        rank = f.evidence.get("rank", f.key)
        try:
            outliers.add(int(rank))
        except (TypeError, ValueError):
            pass
    rows = tuple(
        sorted(
            (
                RankRow(
                    r.rank,
                    r.step,
                    r.loss,
                    r.median_interval,
                    r.tokens_per_s,
                    r.alloc_reserved,
                    r.connected,
                    r.rank in outliers,
                )
                for r in state.ranks.values()
            ),
            key=lambda row: (not row.outlier, row.rank),
        )
    )
    median, worst_rank, worst = run_loss(state)
    meds = {r.rank: m for r in state.ranks.values() if (m := r.median_interval) is not None}
    slowest = max(meds, key=lambda k: meds[k]) if meds else None
    return RanksView(
        rows=rows,
        median_loss=median,
        worst_rank=worst_rank,
        worst_loss=worst,
        median_interval_s=statistics.median(meds.values()) if meds else None,
        slowest_rank=slowest,
        slowest_interval_s=meds[slowest] if slowest is not None else None,
    )


# --------------------------------------------------------------------------- host


@dataclass(frozen=True)
class HostView:
    known: bool
    reason: str  # why the host view is unavailable ("" when it is there)
    available: float | None
    total: float | None
    page_cache: float | None
    cgroup_limit: float | None
    cgroup_usage: float | None
    effective_available: float | None  # the smaller of host and cgroup: what a torch.load gets
    wsl: bool
    level: Level
    finding: str | None


def host_view(state: RunState) -> HostView:
    host = state.probe.host if state.probe is not None else None
    cg = host.cgroup if host is not None else None
    low = _findings(state, *PANEL_CODES["host"])
    reason = "" if host is None or host.available else (host.reason or "host memory view unavailable")
    available = host.mem_available_bytes if host is not None else None
    effective = host.effective_available_bytes if host is not None else None
    return HostView(
        known=host is not None,
        reason=reason,
        available=available,
        total=host.mem_total_bytes if host is not None else None,
        page_cache=host.page_cache_bytes if host is not None else None,
        cgroup_limit=cg.limit_bytes if cg is not None else None,
        cgroup_usage=cg.usage_bytes if cg is not None else None,
        effective_available=effective if effective is not None and effective != available else None,
        wsl=host is not None and host.wsl,
        level=_worst_level(low) if low else ("ok" if host is not None and not reason else "dim"),
        finding=low[0].message if low else None,
    )


# --------------------------------------------------------------------------- disk


@dataclass(frozen=True)
class CheckpointRow:
    step: int | None
    state: CkptState
    size_bytes: int | None
    reason: str | None
    latest: bool  # the newest verified: what a resume would use
    name: str
    eval_figure: float | None = None  # the trainer's own evaluation before promotion ([eval])
    # What it holds of a faithful resume, "model opt -sched rng data" ("" where not read).
    parts: str = ""


@dataclass(frozen=True)
class DiskView:
    known: bool
    path: str
    used_fraction: float | None
    total: float | None
    free: float | None
    time_to_full_s: float | None
    level: Level
    finding: str | None
    checkpoints: tuple[CheckpointRow, ...]  # newest first, pruned ones left out
    pruned: int
    budget: bool = False  # the figures are the root's byte budget (`--disk-budget`), not its disk
    fs_used_fraction: float | None = None  # under a budget: the filesystem's own, as df says it


def disk_view(state: RunState) -> DiskView:
    disk = state.probe.disk if state.probe is not None else None
    codes = _findings(state, *PANEL_CODES["disk"])
    ttf = disk.time_to_full_s if disk is not None else None
    if ttf is None:
        for f in _findings(state, "DISK_FULL_SOON"):
            ttf = _num(f.evidence.get("time_to_full_s"))
    total = disk.total_bytes if disk is not None else None
    free = disk.free_bytes if disk is not None else None
    used_fraction = disk.used_fraction if disk is not None else None
    if used_fraction is None and total and free is not None:
        used_fraction = 1.0 - free / total
    latest = state.last_verified()
    rows = tuple(
        CheckpointRow(
            c.step,
            c.state,
            c.size_bytes,
            c.reason,
            c is latest,
            c.path.rstrip("/").rsplit("/", 1)[-1],
            c.eval.figure if c.eval is not None else None,
            parts=c.report.completeness.marks() if c.report is not None and c.report.completeness else "",
        )
        for c in sorted(state.checkpoints, key=lambda c: (c.step or -1, c.t), reverse=True)
        if c.state != "pruned"
    )
    ordered = sorted(codes, key=lambda f: -SEVERITY_RANK.get(f.severity, 0))
    return DiskView(
        known=disk is not None,
        path=disk.path if disk is not None else "",
        used_fraction=used_fraction,
        total=total,
        free=free,
        time_to_full_s=ttf,
        level=_worst_level(codes) if codes else ("ok" if disk is not None else "dim"),
        finding=ordered[0].message if ordered else None,
        checkpoints=rows,
        pruned=sum(1 for c in state.checkpoints if c.state == "pruned"),
        budget=bool(disk is not None and disk.budget),
        fs_used_fraction=disk.fs_used_fraction if disk is not None and disk.budget else None,
    )
