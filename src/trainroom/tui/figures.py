"""What each panel shows, computed from the run's state and a clock: pure, no Textual.

Every panel of the control room displays one frozen view built here. The app builds them all
under the reader's lock ten times a second at most, then hands each to its widget; a widget only
renders its view. Nothing here decides a verdict: the watchdog's state and its findings are the
judgement, and a view only picks the level (ok / warn / crit) a figure is drawn at from them.

The probe dicts (`ProbeSample.gpu/host/disk`) come from the probes; the keys read here are listed
beside each reader, with the alternatives tolerated until the formats settle. The loss plot reads
the run's `core.series` snapshot (the whole run, downsampled) and falls back to the recent raw
steps while that is empty.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainroom.core.findings import ACTION_KEYS, SEVERITY_RANK, Finding
from trainroom.core.run.series import SeriesSnapshot
from trainroom.core.run.state import RunState

from . import fmt

Level = str  # "ok" | "info" | "warn" | "crit" | "dim"

# Display-only copies of the watchdog's default stall bound (max(3 x median interval, 10 s)):
# the cadence panel draws the age of the last step against it; the verdict is the watchdog's.
STALL_FLOOR_S = 10.0
STALL_FACTOR = 3.0
SPARK_POINTS = 64
LOSS_POINTS = 2000  # what the plot keeps at most, whatever the source holds

_SEVERITY_LEVEL = {"critical": "crit", "warning": "warn", "info": "info"}
_STATE_LEVEL = {
    "running": "ok",
    "starting": "info",
    "slow": "warn",
    "stalled": "crit",
    "hung": "crit",
    "dead": "crit",
    "exited": "dim",
}


def level_of_state(state: str) -> Level:
    return _STATE_LEVEL.get(state, "info")


def _worst_level(findings: Iterable[Finding]) -> Level:
    worst = -1
    for f in findings:
        worst = max(worst, SEVERITY_RANK.get(f.severity, 0))
    return {-1: "ok", 0: "info", 1: "warn", 2: "crit"}[worst]


def _findings(state: RunState, *codes: str) -> list[Finding]:
    return [f for f in state.findings.values() if f.code in codes]


def _first(d: Mapping[str, Any] | None, *keys: str) -> Any:
    """The first key present with a value: probe formats differ by a name or two."""
    if not d:
        return None
    for k in keys:
        v = d.get(k)
        if v is not None:
            return v
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class HeaderView:
    run_id: str
    attempt: int | None
    attempts: int
    state: str
    reason: str
    state_age_s: float | None  # for how long the verdict has held (whole seconds: a view that
    step: int | None  # does not change does not re-render)
    connected: bool


def header_view(state: RunState, now: float, connected: bool) -> HeaderView:
    a = state.attempt
    step = state.current_step()
    if step is None and a is not None:
        step = a.last_step
    return HeaderView(
        run_id=state.run_id,
        attempt=a.n if a else None,
        attempts=len(state.attempts),
        state=state.status,
        reason=state.status_reason,
        state_age_s=float(round(now - state.status_since)) if state.status_since else None,
        step=step,
        connected=connected,
    )


# --------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class TrainerView:
    pid: int | None
    pgid: int | None
    alive: bool
    uptime_s: float | None
    exit_text: str
    exit_level: Level
    instrumented: bool
    command: str
    crash: str | None  # the innermost error of the attempt's crash chain
    resume_from: str | None


def trainer_view(state: RunState, now: float) -> TrainerView:
    a = state.attempt
    if a is None:
        return TrainerView(
            None, None, False, None, "no attempt yet", "dim", False, " ".join(state.argv), None, None
        )
    if a.alive:
        exit_text, level, uptime = "running", "ok", now - a.started_at
    else:
        uptime = (a.ended_at or now) - a.started_at
        if a.error:
            exit_text, level = f"could not start: {a.error}", "crit"
        elif a.exit_signal is not None:
            exit_text, level = f"killed by {fmt.signal_name(a.exit_signal)} ({a.exit_signal})", "crit"
        elif a.exit_code:
            exit_text, level = f"exit code {a.exit_code}", "crit"
        elif a.exit_code == 0:
            exit_text, level = "exit code 0", "dim"
        else:
            exit_text, level = "ended", "dim"
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
        instrumented=a.instrumented,
        command=" ".join(argv),
        crash=crash,
        resume_from=a.resume_from,
    )


# --------------------------------------------------------------------------- VRAM


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


def vram_view(state: RunState) -> VramView:
    gpu = state.probe.gpu if state.probe is not None else None
    ranks = list(state.ranks.values())
    reserved = [r.alloc_reserved for r in ranks if r.alloc_reserved is not None]
    allocated = [r.alloc_allocated for r in ranks if r.alloc_allocated is not None]
    peak = [r.alloc_peak for r in ranks if r.alloc_peak is not None]
    alloc_reserved = float(sum(reserved)) if reserved else None
    level = _worst_level(_findings(state, "GHOST_MEMORY", "ORPHAN_CONTEXT"))
    common = dict(
        alloc_allocated=float(sum(allocated)) if allocated else None,
        alloc_reserved=alloc_reserved,
        alloc_peak=float(sum(peak)) if peak else None,
    )
    if gpu is None or not gpu.available:
        reason = "no probe yet" if gpu is None else (gpu.reason or "unknown reason")
        return VramView(
            False,
            reason.removeprefix("driver view unavailable: "),
            "",
            None,
            None,
            None,
            False,
            ratio=None,
            util_percent=None,
            power_w=None,
            level=level,
            **common,
        )
    devices = gpu.devices
    used = [d.used_bytes for d in devices if d.used_bytes is not None]
    total = [d.total_bytes for d in devices if d.total_bytes is not None]
    utils = [d.util_percent for d in devices if d.util_percent is not None and d.util_percent <= 100]
    powers = [d.power_w for d in devices if d.power_w is not None]
    name = (devices[0].name or "") if devices else ""
    if len(devices) > 1:
        name += f" (+{len(devices) - 1})"
    per_process = bool(gpu.per_process)
    run_bytes = None
    if per_process:
        known = [x.used_bytes for x in gpu.ours if x.used_bytes is not None]
        run_bytes = float(sum(known)) if known else None
    driver_used = float(sum(used)) if used else None
    attributed = run_bytes if per_process else driver_used
    ratio = attributed / alloc_reserved if attributed is not None and alloc_reserved else None
    return VramView(
        driver_ok=True,
        driver_reason="",
        device=name,
        driver_used=driver_used,
        driver_total=float(sum(total)) if total else None,
        run_bytes=run_bytes,
        per_process=per_process,
        ratio=ratio,
        util_percent=float(max(utils)) if utils else None,
        power_w=sum(powers) if powers else None,
        level=level,
        **common,
    )


# --------------------------------------------------------------------------- cadence


@dataclass(frozen=True)
class CadenceView:
    steps_per_s: float | None
    interval_s: float | None  # median step interval of the slowest rank
    tokens_per_s: float | None
    last_step_age_s: float | None
    bound_s: float  # the stall bound the age is drawn against (or the current phase's own)
    phase: str
    stopped: bool  # the attempt ended: the age no longer grows
    intervals: tuple[float, ...]
    level: Level


def stall_bound(interval_s: float | None) -> float:
    return max(STALL_FACTOR * interval_s, STALL_FLOOR_S) if interval_s else STALL_FLOOR_S


def cadence_view(state: RunState, now: float) -> CadenceView:
    interval = state.step_interval()
    last = state.last_step_t()
    a = state.attempt
    stopped = a is None or not a.alive
    ref = (a.ended_at if a is not None and a.ended_at is not None else now) if stopped else now
    age = round(ref - last, 1) if last is not None else None  # tenths: what the panel shows
    ranks = list(state.ranks.values())
    pacing = max(ranks, key=lambda r: r.median_interval or 0.0, default=None)
    intervals = tuple(pacing.intervals[-SPARK_POINTS:]) if pacing is not None else ()
    phase, bound = "train", stall_bound(interval)
    for r in ranks:
        if r.phase != "train":
            phase = r.phase
            if r.phase_bound_s:
                bound = max(bound, r.phase_bound_s)
    tps = [r.tokens_per_s for r in ranks if r.tokens_per_s is not None]
    if state.status in ("stalled", "hung", "dead"):
        level = "crit"
    elif state.status == "slow" or (age is not None and not stopped and age > bound / 2):
        level = "warn"
    elif stopped:
        level = "dim"
    else:
        level = "ok"
    return CadenceView(
        steps_per_s=1.0 / interval if interval else None,
        interval_s=interval,
        tokens_per_s=sum(tps) if tps else None,
        last_step_age_s=age,
        bound_s=bound,
        phase=phase,
        stopped=stopped,
        intervals=intervals,
        level=level,
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
    mismatch = _findings(state, "LR_MISMATCH")
    return LrView(
        requested=requested,
        groups=groups,
        warmup_steps=a.requested.warmup_steps if a is not None else None,
        level=_worst_level(mismatch) if mismatch else ("ok" if groups else "dim"),
        finding=mismatch[0].message if mismatch else None,
    )


# --------------------------------------------------------------------------- loss


@dataclass(frozen=True)
class Mark:
    x: float
    kind: str  # checkpoint | restart | lr-change | loss-scale | nonfinite


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


_LOSS_CODES = (
    "LOSS_SPIKE",
    "DIVERGENCE",
    "NONFINITE",
    "WHITE_MODEL",
    "EXPLODED_START",
    "RANK_OUTLIER",
    "GRAD_EXPLOSION",
)


def loss_view(state: RunState, series: SeriesSnapshot | None = None) -> LossView:
    a = state.attempt
    vocab = a.requested.vocab_size if a is not None else None
    ln_v = math.log(vocab) if vocab and vocab > 1 else None
    points: list[tuple[float, float]] = []
    marks: list[Mark] = []
    x_label = "tokens"
    if series is not None:
        points, marks, x_label = _series_points(series)
        if ln_v is None:
            ln_v = series.loss_baseline
    if len(points) < 2:
        points, marks, x_label = _recent_points(state)
    median, worst_rank, worst = state.headline_loss()
    return LossView(
        points=tuple(points[-LOSS_POINTS:]),
        x_label=x_label,
        ln_v=ln_v,
        vocab_size=vocab,
        marks=tuple(marks),
        median=median,
        worst_rank=worst_rank,
        worst=worst,
        ranks=len(state.ranks),
        level=_worst_level(_findings(state, *_LOSS_CODES)),
    )


def _series_points(series: SeriesSnapshot) -> tuple[list[tuple[float, float]], list[Mark], str]:
    """The min/max buckets of `core.series` (the whole run, downsampled): each bucket is drawn
    from its min to its max at its centre, so a spike inside a bucket stays visible."""
    points: list[tuple[float, float]] = []
    col = series.loss
    marks = [Mark(m.x, m.kind) for m in series.marks]
    for k, x in enumerate(series.centres()):
        lo = col.lo[k] if k < len(col.lo) else None
        hi = col.hi[k] if k < len(col.hi) else None
        for y in (lo, hi) if lo != hi else (lo,):
            if y is not None and math.isfinite(y):
                points.append((x, y))
        if col.nonfinite and k < len(col.nonfinite) and col.nonfinite[k]:
            marks.append(Mark(x, "nonfinite"))
    return points, marks, "step" if series.x_unit == "steps" else "tokens"


def _recent_points(state: RunState) -> tuple[list[tuple[float, float]], list[Mark], str]:
    """The recent raw steps: the median loss over ranks per (attempt, step), against tokens
    when every step carries them, else against the step number."""
    by_step: dict[tuple[int, int], list[float]] = {}
    x_of: dict[tuple[int, int], float] = {}
    use_tokens = bool(state.recent_steps) and all(r.tokens is not None for r in state.recent_steps)
    nonfinite: list[tuple[int, int]] = []
    for r in state.recent_steps:
        key = (r.attempt, r.step)
        x_of[key] = max(
            x_of.get(key, 0.0), float(r.tokens if use_tokens and r.tokens is not None else r.step)
        )
        if r.loss is None:
            continue
        if math.isfinite(r.loss):
            by_step.setdefault(key, []).append(r.loss)
        else:
            nonfinite.append(key)
    keys = sorted(x_of, key=lambda k: (k[0], k[1]))
    points = [(x_of[k], statistics.median(by_step[k])) for k in keys if k in by_step]
    marks: list[Mark] = []
    step_x = {k[1]: x_of[k] for k in keys}
    seen_attempts: set[int] = set()
    for k in keys:
        if k[0] not in seen_attempts:
            if seen_attempts:
                marks.append(Mark(x_of[k], "restart"))
            seen_attempts.add(k[0])
    for c in state.checkpoints:
        if c.step is not None and c.step in step_x:
            marks.append(Mark(step_x[c.step], "checkpoint"))
    for n in state.notes:
        step = n.get("step")
        kind = str(n.get("kind", ""))
        if isinstance(step, int) and step in step_x and kind.startswith(("lr", "loss-scale")):
            marks.append(Mark(step_x[step], "lr-change" if kind.startswith("lr") else "loss-scale"))
    for k in nonfinite:
        marks.append(Mark(x_of[k], "nonfinite"))
    return points, marks, "tokens" if use_tokens else "step"


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
    median, worst_rank, worst = state.headline_loss()
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
    low = _findings(state, "HOST_RAM_LOW")
    if host is None:
        return HostView(
            False,
            "",
            None,
            None,
            None,
            None,
            None,
            None,
            False,
            _worst_level(low) if low else "dim",
            low[0].message if low else None,
        )
    reason = "" if host.available else (host.reason or "host memory view unavailable")
    available = host.mem_available_bytes
    effective = host.effective_available_bytes
    return HostView(
        known=True,
        reason=reason,
        available=available,
        total=host.mem_total_bytes,
        page_cache=host.page_cache_bytes,
        cgroup_limit=cg.limit_bytes if cg is not None else None,
        cgroup_usage=cg.usage_bytes if cg is not None else None,
        effective_available=effective if effective is not None and effective != available else None,
        wsl=host.wsl,
        level=_worst_level(low) if low else ("ok" if not reason else "dim"),
        finding=low[0].message if low else None,
    )


# --------------------------------------------------------------------------- disk


@dataclass(frozen=True)
class CheckpointRow:
    step: int | None
    state: str  # candidate | verifying | verified | rejected | pruned
    size_bytes: int | None
    reason: str | None
    latest: bool  # the newest verified: what a resume would use
    name: str


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


def disk_view(state: RunState) -> DiskView:
    disk = state.probe.disk if state.probe is not None else None
    codes = _findings(state, "DISK_HIGH", "DISK_FULL_SOON", "DRVFS_CHECKPOINTS", "CKPT_REJECTED")
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
            c.step, c.state, c.size_bytes, c.reason, c is latest, c.path.rstrip("/").rsplit("/", 1)[-1]
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
    )


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class FindingRow:
    code: str
    severity: str
    level: Level
    message: str
    action: str | None
    key: str | None  # the control-room key of the suggested action
    first_seen: float


def findings_view(state: RunState) -> tuple[FindingRow, ...]:
    """Most severe first, then newest (the order every client uses)."""
    return tuple(
        FindingRow(
            f.code,
            f.severity,
            _SEVERITY_LEVEL.get(f.severity, "info"),
            f.message,
            f.action,
            ACTION_KEYS.get(f.action) if f.action else None,
            f.first_seen,
        )
        for f in state.open_findings()
    )


# --------------------------------------------------------------------------- all of it


@dataclass(frozen=True)
class Views:
    header: HeaderView
    trainer: TrainerView
    vram: VramView
    cadence: CadenceView
    lr: LrView
    loss: LossView
    ranks: RanksView
    host: HostView
    disk: DiskView
    findings: tuple[FindingRow, ...] = field(default=())


def compute(state: RunState, now: float, connected: bool, series: SeriesSnapshot | None = None) -> Views:
    return Views(
        header=header_view(state, now, connected),
        trainer=trainer_view(state, now),
        vram=vram_view(state),
        cadence=cadence_view(state, now),
        lr=lr_view(state),
        loss=loss_view(state, series),
        ranks=ranks_view(state),
        host=host_view(state),
        disk=disk_view(state),
        findings=findings_view(state),
    )


def live_attempt(state: RunState) -> bool:
    a = state.attempt
    return a is not None and a.alive


def has_checkpoints(state: RunState, states: Sequence[str] = ("candidate", "verified")) -> bool:
    return any(c.state in states for c in state.checkpoints)
