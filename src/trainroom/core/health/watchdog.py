"""The watchdog: the run's state (starting, running, slow, stalled, hung, dead, exited) and the
findings about life, progress, the GPU, host RAM, locks, duplicates and crash causes.

Every rule is a pure function of the run (`state.RunState`, the fold every client sees), the
latest probe results (`WatchContext`) and the clock `now`, in this one module. What must outlive
one call (a ghost seen for two probe cycles, how long a pid has sat in D, when a main thread last
ran) lives in a small `Watchdog` object, not in globals. The keeper calls `Watchdog.evaluate`
every tick, diffs the findings against what is open, and stamps first/last seen.

Why these signals (seed 001): log age detects slowness, absence detects death. DEAD comes from
the keeper's waitpid, not from silence; STALLED is "alive and beating but not stepping" (the
seed-004 accumulation-counter bug); HUNG is "alive and not even beating" or stopped (T) or stuck
in the kernel (D) or a main thread parked on one line.

Wiring (the keeper, one Watchdog per run, all on the event-loop thread except the probe cycle):

    sweep = probes.sweep.ProbeSweep(lock_paths=cfg.lock_files)          # once
    sample = sweep.sample(targets_of(run))                                # worker thread, ~1 s
    keeper.emit(sample, journal=False)                                   # -> run.probe
    ctx = context_from_probe(run.probe, thresholds=cfg.thresholds,
                             alive=<child not yet reaped>, attempt=run.attempt.n)
    verdict = watchdog.evaluate(run, ctx, now)                           # every tick (0.1-0.25 s)
"""

from __future__ import annotations

import errno as errno_mod
import re
import signal
import statistics
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.run.state import AttemptView, RankView, RunState, StepRow
from trainroom.core.samples import (
    Duplicate,
    GpuDevice,
    GpuProcess,
    GpuSample,
    HostSample,
    LockHolder,
    LockInfo,
    ProcsSample,
)

GIB = 1 << 30

STATES = ("starting", "running", "slow", "stalled", "hung", "dead", "exited")


class WatchContext(msgspec.Struct, kw_only=True):
    """What the watchdog needs beyond RunState: thresholds, the latest probe results, life."""

    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)
    # The keeper's pidfd/psutil view of the attempt's main pid; None: unknown (trust the record).
    alive: bool | None = None
    # The attempt's process group members (probes.procs.group_states keys).
    attempt_pids: list[int] = []
    gpu: GpuSample | None = None  # probes.gpu.GpuProbe.sample()
    host: HostSample | None = None  # probes.host.HostProbe.sample()
    proc_states: dict[int, str] = {}  # pid -> state letter (probes.procs.group_states)
    activity: dict[int, int] = {}  # pid -> main-thread activity counter (probes.procs.group_activity)
    locks: list[LockInfo] = []  # probes.locks.lock_holders()
    duplicates: list[Duplicate] = []  # probes.procs.trainer_duplicates / host_process_duplicates
    # The last traceback of trainer.log (crash_from_log) when the reporter sent no Crash.
    log_crash: p.Crash | None = None
    # When the probe cycle behind proc_states/activity ran; None: unknown (taken as fresh).
    probe_t: float | None = None


class Verdict(msgspec.Struct, kw_only=True):
    state: str
    reason: str
    findings: list[Finding] = []


# --------------------------------------------------------------------------- formatting


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def fmt_s(s: float) -> str:
    if s >= 120:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def errno_name(link: p.ErrorLink) -> str | None:
    if link.errno_name:
        return link.errno_name
    if link.errno is not None:
        return errno_mod.errorcode.get(link.errno)
    return None


# --------------------------------------------------------------------------- cadence


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
    return None if median is None else max(th.stall_factor * median, th.stall_floor_s)


def phase_bound(rank: RankView, th: Thresholds) -> float | None:
    if rank.phase == "train":
        return None
    if rank.phase_bound_s is not None:
        return rank.phase_bound_s
    return th.phase_bounds_s.get(rank.phase, max(th.phase_bounds_s.values(), default=th.start_grace_s))


# --------------------------------------------------------------------------- memory across calls


class Memory(msgspec.Struct, kw_only=True):
    """What the Watchdog keeps between calls; rules read it, only Watchdog.observe writes it."""

    attempt: int = 0
    gpu_t: float | None = None  # the last GPU sample seen (cycles count on new samples only)
    ghost_streak: int = 0
    busy_streak: dict[int, int] = {}  # device index -> consecutive busy-with-nothing-of-ours cycles
    orphan_streak: dict[int, int] = {}  # driver pid -> consecutive cycles listed while gone or a zombie
    d_since: dict[int, float] = {}  # pid -> when it was first seen in D (reset on any other state)
    activity: dict[int, int] = {}  # pid -> last activity counter
    active_at: dict[int, float] = {}  # pid -> when that counter last moved (or was first seen)
    activity_t: float | None = None  # the probe cycle behind the latest activity counters


# --------------------------------------------------------------------------- life and progress


def _ended_verdict(run: RunState, a: AttemptView, ctx: WatchContext) -> tuple[str, str, list[Finding]]:
    if a.exit_code == 0 and a.exit_signal is None and a.error is None:
        at = f" at step {a.last_step}" if a.last_step is not None else ""
        return "exited", f"attempt {a.n} exited 0{at}", []
    return "dead", _death_cause(a), [dead_finding(run, a, ctx)]


def _death_cause(a: AttemptView) -> str:
    if a.error:
        return a.error
    if a.exit_signal is not None:
        return f"killed by {signal_name(a.exit_signal)}"
    if a.exit_code is not None:
        code = a.exit_code
        if code > 128 and 1 <= code - 128 < 65:
            return f"exit code {code} (128+{signal_name(code - 128)}, through a shell)"
        return f"exit code {code}"
    return "process gone, exit status not yet known"


def dead_finding(run: RunState, a: AttemptView, ctx: WatchContext) -> Finding:
    """DEAD: the cause, the last step, and what was lost since the last verified checkpoint."""
    cause = _death_cause(a)
    crash = a.crash or ctx.log_crash
    verified = run.last_verified()
    start = a.first_step - 1 if a.first_step is not None else None
    if a.last_step is None:
        lost_txt, lost = "before its first step", None
    elif verified is not None and verified.step is not None:
        lost = max(0, a.last_step - verified.step)
        lost_txt = f"at step {a.last_step}; {lost} steps lost since the last verified checkpoint (step {verified.step})"
    else:
        lost = a.last_step - start if start is not None else None
        lost_txt = f"at step {a.last_step}; no verified checkpoint" + (
            f", {lost} steps of this attempt lost" if lost is not None else ""
        )
    if crash is not None and crash.chain:
        inner = crash.chain[-1]
        why = f"{inner.type}: {inner.message}"
    elif a.exit_signal is not None:
        why = "no traceback"
    else:
        why = ""
    oom_hint = ""
    avail = ctx.host.effective_available_bytes if ctx.host is not None else None
    if a.exit_signal == signal.SIGKILL and avail is not None and avail < ctx.thresholds.host_ram_low_bytes:
        oom_hint = f"; host RAM was low ({fmt_bytes(avail)} available): the OOM killer is a suspect"
    message = f"attempt {a.n} {cause} {lost_txt}" + (f" ({why})" if why else "") + oom_hint
    last_ckpt = max((c.step for c in run.checkpoints if c.step is not None), default=None)
    return Finding(
        code="DEAD",
        severity="critical",
        message=message,
        action="resume",
        key=f"attempt-{a.n}",
        evidence={
            "attempt": a.n,
            "exit_code": a.exit_code,
            "exit_signal": a.exit_signal,
            "signal": signal_name(a.exit_signal) if a.exit_signal is not None else None,
            "error": a.error,
            "last_step": a.last_step,
            "steps_lost": lost,
            "last_verified_step": verified.step if verified is not None else None,
            "last_verified_path": verified.path if verified is not None else None,
            "last_checkpoint_step": last_ckpt,
            "ended_at": a.ended_at,
        },
    )


def _watched_pids(a: AttemptView, run: RunState) -> list[int]:
    pids = {a.pid} | {r.pid for r in run.ranks.values() if r.pid}
    return sorted(x for x in pids if x and x > 0)


def _activity_fresh(mem: Memory, now: float, th: Thresholds) -> bool:
    """A counter that stood still only says "parked" if the probe kept reading it: a probe cycle
    that itself stalled (a slow /proc, a wedged NVML call) must not make a busy loop look parked."""
    return mem.activity_t is None or now - mem.activity_t <= th.park_slack_s


def _main_thread_parked(
    pid: int | None, mem: Memory, now: float, bound: float, th: Thresholds | None = None
) -> bool | None:
    """True: the main thread has not run for `bound`; False: it ran; None: no (fresh) activity data."""
    if pid is None or pid not in mem.active_at:
        return None
    if not _activity_fresh(mem, now, th or Thresholds()):
        return None
    return now - mem.active_at[pid] > bound


def progress(run: RunState, ctx: WatchContext, now: float, mem: Memory) -> tuple[str, str, list[Finding]]:
    """The state of a live attempt and its STALLED / HUNG / SLOW finding.

    The reason (what RunStatus journals on each change) holds no growing figure, so it changes
    only when the diagnosis does; the finding's message carries the figures.
    """
    a = run.attempt
    assert a is not None
    th = ctx.thresholds
    median = median_interval(run, th)
    bound = progress_bound(median, th)
    ranks = list(run.ranks.values())
    grace = max(th.start_grace_s, th.stall_floor_s)

    # Stopped or stuck in the kernel: no progress is possible whatever the telemetry says.
    for pid in _watched_pids(a, run):
        st = ctx.proc_states.get(pid)
        if st in ("T", "t"):
            why = "SIGSTOP or a debugger" if st == "T" else "being traced"
            return (
                "hung",
                f"pid {pid} stopped (state {st})",
                [
                    hung_finding(
                        f"pid {pid} is stopped (state {st}: {why}); it makes no progress until SIGCONT",
                        {"cause": "stopped", "pid": pid, "state": st, "last_step": a.last_step},
                    )
                ],
            )
        d_bound = th.d_state_bound_s if th.d_state_bound_s is not None else (bound or th.stall_floor_s)
        if st == "D" and pid in mem.d_since and now - mem.d_since[pid] > d_bound:
            held = now - mem.d_since[pid]
            return (
                "hung",
                f"pid {pid} stuck in uninterruptible I/O (state D)",
                [
                    hung_finding(
                        f"pid {pid} has sat in uninterruptible I/O (state D) for {fmt_s(held)} (bound {fmt_s(d_bound)}): "
                        "a stuck filesystem or driver call",
                        {
                            "cause": "d-state",
                            "pid": pid,
                            "state": "D",
                            "for_s": round(held, 1),
                            "bound_s": d_bound,
                            "last_step": a.last_step,
                        },
                    )
                ],
            )

    if a.bye is not None:
        return "running", f"trainer said bye ({a.bye}); waiting for it to exit", []

    stepped = [r for r in ranks if r.last_step_t is not None]
    if a.instrumented:
        hung = _silent_or_parked(a, ranks, bool(stepped), bound, grace, now, mem, th)
        if hung is not None:
            return "hung", hung[0], [hung_finding(hung[1], hung[2])]

    if not stepped:
        in_phase = [(r, pb) for r in ranks if (pb := phase_bound(r, th)) is not None]
        for r, pb in in_phase:
            since = now - (r.phase_since or a.started_at)
            if since > pb:
                return _stalled(
                    a,
                    f"{r.phase} phase over its {fmt_s(pb)} bound",
                    f"{r.phase} phase for {fmt_s(since)}, over its bound {fmt_s(pb)}",
                    {
                        "cause": "phase",
                        "rank": r.rank,
                        "phase": r.phase,
                        "phase_s": round(since, 1),
                        "bound_s": pb,
                    },
                    ctx,
                )
        if in_phase:
            r, pb = in_phase[0]
            return "starting", f"{r.phase} phase (bound {fmt_s(pb)})", []
        if not a.instrumented:
            if now - a.started_at <= th.start_grace_s:
                return "starting", "no step seen yet (uninstrumented: watching the log)", []
            return "running", "uninstrumented: no step telemetry in the log; watching life only", []
        ref = max([a.started_at] + [r.phase_since for r in ranks if r.phase_since is not None])
        waited = now - ref
        if waited <= th.start_grace_s:
            return "starting", "no step yet", []
        return _stalled(
            a,
            f"alive, heartbeats flowing, no first step within the {fmt_s(th.start_grace_s)} start grace",
            f"alive, heartbeats flowing, no first step after {fmt_s(waited)} "
            f"(start grace {fmt_s(th.start_grace_s)})",
            {
                "cause": "no-first-step",
                "waited_s": round(waited, 1),
                "bound_s": th.start_grace_s,
                "last_step": None,
            },
            ctx,
        )

    # Progress of the ranks that step (some setups report steps from rank 0 only).
    step_bound = bound if bound is not None else grace
    if bound is not None:
        bound_txt = (
            f"bound {fmt_s(step_bound)} = max({th.stall_factor:g} x median step {median:.2f} s, "
            f"floor {fmt_s(th.stall_floor_s)})"
        )
    else:
        bound_txt = f"warm-up bound {fmt_s(step_bound)}"
    worst: tuple[float, str, str, dict[str, Any]] | None = None  # (excess ratio, reason, message, evidence)
    for r in stepped:
        assert r.last_step_t is not None
        pb = phase_bound(r, th)
        if pb is not None:
            since = now - (r.phase_since or r.last_step_t)
            if since > pb and (worst is None or since / pb > worst[0]):
                worst = (
                    since / pb,
                    f"{r.phase} phase over its {fmt_s(pb)} bound",
                    f"{r.phase} phase for {fmt_s(since)}, over its bound {fmt_s(pb)}",
                    {
                        "cause": "phase",
                        "rank": r.rank,
                        "phase": r.phase,
                        "phase_s": round(since, 1),
                        "bound_s": pb,
                        "last_step": r.step,
                    },
                )
            continue
        # A phase that just ended restarts the clock: the next step is on its way.
        gap = now - max(r.last_step_t, r.phase_since or 0.0)
        if gap > step_bound and (worst is None or gap / step_bound > worst[0]):
            beats = "heartbeats flowing" if a.instrumented else "process running (uninstrumented)"
            worst = (
                gap / step_bound,
                f"alive, {beats}, no step within {fmt_s(step_bound)}",
                f"alive, {beats}, no step for {fmt_s(gap)} ({bound_txt})",
                {
                    "cause": "no-step",
                    "rank": r.rank,
                    "gap_s": round(gap, 1),
                    "bound_s": step_bound,
                    "median_s": median,
                    "last_step": r.step,
                },
            )
    if worst is not None:
        _, reason, message, evidence = worst
        # Heartbeats flow but the main thread has sat on one line, not running, since its last
        # step: the gap is a park (a deadlock), not a loop that never steps. Said at the step
        # bound, not a heartbeat later when the frame's own age passes it.
        r = run.ranks.get(evidence["rank"])
        if a.instrumented and r is not None and _parked_since_last_step(r, a, mem, now, th):
            age = _main_frame_age(r, now) or 0.0
            return (
                "hung",
                f"rank {r.rank}: main thread parked on {r.main_frame}",
                [
                    hung_finding(
                        f"rank {r.rank}: heartbeats flow but the main thread has sat on {r.main_frame} since step {r.step}, "
                        f"for {fmt_s(age)} (bound {fmt_s(step_bound)}): a deadlock or a blocking call",
                        {
                            "cause": "main-frame",
                            "rank": r.rank,
                            "pid": r.pid,
                            "main_frame": r.main_frame,
                            "main_frame_age_s": round(age, 1),
                            "bound_s": step_bound,
                            "last_step": r.step,
                            "main_thread_parked": True,
                        },
                    )
                ],
            )
        # Without heartbeats, a main thread that has not run for the whole bound is parked: a hang.
        if not a.instrumented and _main_thread_parked(a.pid, mem, now, step_bound, th):
            return (
                "hung",
                f"no step within {fmt_s(step_bound)} and the main thread is parked",
                [
                    hung_finding(
                        f"{message}; the main thread of pid {a.pid} has not run for over {fmt_s(step_bound)}: "
                        "blocked (a lock, a pipe, a peer)",
                        {**evidence, "cause": "parked", "pid": a.pid},
                    )
                ],
            )
        return _stalled(a, reason, message, evidence, ctx)

    slow = slow_check(stepped, th)
    if slow is not None:
        return "slow", f"steps slower than {th.slow_factor:g} x the median", [slow]
    return "running", "steps flowing", []


def _main_frame_age(r: RankView, now: float) -> float | None:
    """How long the main thread has sat on the line the last heartbeat sampled, as of `now`; None
    when nothing was sampled, or a step or phase change came after the sample (both are sent by
    the main thread: it has moved since). Time inside a phase is the phase's, not a park."""
    if r.main_frame_age_s is None or r.last_heartbeat_t is None:
        return None
    if max(r.last_step_t or 0.0, r.phase_since or 0.0) > r.last_heartbeat_t:
        return None
    age = r.main_frame_age_s + max(0.0, now - r.last_heartbeat_t)
    if r.phase_since is not None:
        age = min(age, now - r.phase_since)
    return age


def _parked_since_last_step(r: RankView, a: AttemptView, mem: Memory, now: float, th: Thresholds) -> bool:
    """The rank's main thread has sat on one line (the heartbeat's frame) and not run (the /proc
    activity counter) since about its last step (or the end of its last phase). Both views are
    needed: a loop that never steps can keep returning to one line, but its counter moves."""
    if r.last_step_t is None or r.last_heartbeat_t is None or r.main_frame_age_s is None:
        return False
    moved_at = max(r.last_step_t, r.phase_since or 0.0)
    if r.last_heartbeat_t <= moved_at:
        return False  # no frame sampled since the main thread last said it moved
    frame_since = r.last_heartbeat_t - r.main_frame_age_s
    active_at = mem.active_at.get(r.pid or a.pid)
    if active_at is None or not _activity_fresh(mem, now, th):
        return False
    limit = moved_at + th.park_slack_s
    return frame_since <= limit and active_at <= limit


def _silent_or_parked(
    a: AttemptView,
    ranks: list[RankView],
    stepped: bool,
    bound: float | None,
    grace: float,
    now: float,
    mem: Memory,
    th: Thresholds,
) -> tuple[str, str, dict[str, Any]] | None:
    """HUNG for an instrumented attempt: a rank with no heartbeat (nor step) within its bound, or
    whose main thread has sat on one line past it while nothing says the thread still runs."""
    worst: tuple[float, str, str, dict[str, Any]] | None = None
    for r in ranks:
        pb = phase_bound(r, th)
        if pb is not None:
            hb_bound = pb
        elif stepped and bound is not None:
            hb_bound = bound
        else:  # before the first steps (imports, compile, data): the start grace
            hb_bound = grace
        beats = [t for t in (r.last_heartbeat_t, r.last_step_t, r.phase_since) if t is not None]
        silent = now - (max(beats) if beats else a.started_at)
        if silent > hb_bound:
            if worst is None or silent / hb_bound > worst[0]:
                worst = (
                    silent / hb_bound,
                    f"rank {r.rank} silent: no heartbeat within {fmt_s(hb_bound)}",
                    f"rank {r.rank} alive but silent: no heartbeat (nor step) for {fmt_s(silent)} "
                    f"(bound {fmt_s(hb_bound)}); last step {r.step}",
                    {
                        "cause": "silent",
                        "rank": r.rank,
                        "pid": r.pid,
                        "silent_s": round(silent, 1),
                        "bound_s": hb_bound,
                        "last_step": r.step,
                        "phase": r.phase,
                    },
                )
            continue
        age = _main_frame_age(r, now)
        if age is None:
            continue
        parked = _main_thread_parked(r.pid or a.pid, mem, now, hb_bound, th)
        # A main thread that keeps running (a loop that never steps) is a stall, not a hang.
        if age > hb_bound and parked is not False and (worst is None or age / hb_bound > worst[0]):
            worst = (
                age / hb_bound,
                f"rank {r.rank}: main thread parked on {r.main_frame}",
                f"rank {r.rank}: heartbeats flow but the main thread has sat on {r.main_frame} for "
                f"{fmt_s(age)} (bound {fmt_s(hb_bound)}): a deadlock or a blocking call",
                {
                    "cause": "main-frame",
                    "rank": r.rank,
                    "pid": r.pid,
                    "main_frame": r.main_frame,
                    "main_frame_age_s": round(age, 1),
                    "bound_s": hb_bound,
                    "last_step": r.step,
                    "main_thread_parked": parked,
                },
            )
    return None if worst is None else (worst[1], worst[2], worst[3])


def _stalled(
    a: AttemptView, reason: str, message: str, evidence: dict[str, Any], ctx: WatchContext
) -> tuple[str, str, list[Finding]]:
    odd = {pid: st for pid, st in ctx.proc_states.items() if st in ("T", "t", "D", "Z")}
    if odd:
        evidence = {**evidence, "odd_processes": {str(k): v for k, v in sorted(odd.items())}}
    return (
        "stalled",
        reason,
        [
            Finding(
                code="STALLED",
                severity="warning",
                message=message,
                action="dump",
                evidence={**evidence, "attempt": a.n},
            )
        ],
    )


def hung_finding(message: str, evidence: dict[str, Any]) -> Finding:
    return Finding(code="HUNG", severity="critical", message=message, action="dump", evidence=evidence)


def slow_check(stepped: list[RankView], th: Thresholds) -> Finding | None:
    """SLOW: each of the last K intervals over slow_factor x the median of the ones before them."""
    k = th.slow_steps
    worst: tuple[float, RankView, list[float], float] | None = None
    for r in stepped:
        iv = r.intervals
        if k <= 0 or len(iv) < k + th.slow_baseline_min:
            continue
        base = statistics.median(iv[:-k])
        recent = iv[-k:]
        if base > 0 and min(recent) > th.slow_factor * base:
            ratio = statistics.median(recent) / base
            if worst is None or ratio > worst[0]:
                worst = (ratio, r, recent, base)
    if worst is None:
        return None
    ratio, r, recent, base = worst
    return Finding(
        code="SLOW",
        severity="warning",
        action="bench",
        message=(
            f"steps slowed {ratio:.1f}x: the last {k} took {min(recent):.2f}-{max(recent):.2f} s against a "
            f"median of {base:.2f} s (rank {r.rank}); ghost VRAM, throttling or a sick GPU: bench it"
        ),
        evidence={
            "rank": r.rank,
            "recent_s": [round(x, 3) for x in recent],
            "median_s": round(base, 4),
            "ratio": round(ratio, 2),
            "factor": th.slow_factor,
        },
    )


def repeat_death(run: RunState, th: Thresholds) -> Finding | None:
    """REPEAT_DEATH: the last two deaths within the window of the same step. Cleared once a later
    attempt gets past that region."""
    dead = [
        a
        for a in run.attempts
        if a.ended_at is not None
        and a.last_step is not None
        and a.error is None
        and not (a.exit_code == 0 and a.exit_signal is None)
    ]
    if len(dead) < 2:
        return None
    last, prev = dead[-1], dead[-2]
    assert last.last_step is not None and prev.last_step is not None
    if abs(last.last_step - prev.last_step) > th.repeat_death_window_steps:
        return None
    cur = run.attempt
    region_end = max(last.last_step, prev.last_step) + th.repeat_death_window_steps
    if cur is not None and cur.n > last.n and cur.last_step is not None and cur.last_step > region_end:
        return None
    return Finding(
        code="REPEAT_DEATH",
        severity="warning",
        message=(
            f"attempts {prev.n} and {last.n} both died near step {last.last_step} ({prev.last_step} and "
            f"{last.last_step}, within {th.repeat_death_window_steps} steps): once is bad luck, twice in the "
            "same place is a pattern in that region of training (a batch, a shard, the schedule)"
        ),
        key=f"step-{last.last_step}",
        evidence={
            "attempts": [prev.n, last.n],
            "steps": [prev.last_step, last.last_step],
            "window_steps": th.repeat_death_window_steps,
            "causes": [_death_cause(prev), _death_cause(last)],
        },
    )


# --------------------------------------------------------------------------- crash cause


def masked_error(a: AttemptView, log_crash: p.Crash | None) -> Finding | None:
    """MASKED_ERROR: the innermost link of the crash chain differs from the outermost."""
    crash = a.crash or log_crash
    if crash is None or len(crash.chain) < 2:
        return None
    outer, inner = crash.chain[0], crash.chain[-1]
    if (outer.type, outer.message) == (inner.type, inner.message):
        return None
    en = errno_name(inner)
    inner_txt = f"{inner.type}: {inner.message}" + (f" ({en})" if en else "")
    outer_txt = f"{outer.type}: {outer.message}" if outer.message else outer.type
    action = "reclaim" if en == "ENOMEM" else None
    advice = "; host RAM ran out: reclaim the page cache before a resume" if action else ""
    return Finding(
        code="MASKED_ERROR",
        severity="warning",
        action=action,
        key=f"attempt-{a.n}",
        message=f"`{outer_txt}` hides `{inner_txt}`{advice}",
        evidence={
            "attempt": a.n,
            "outer": msgspec.to_builtins(outer),
            "inner": msgspec.to_builtins(inner),
            "chain": [f"{x.type}: {x.message}" for x in crash.chain],
            "errno_name": en,
            "source": crash.source,
        },
    )


_TB_HEAD = re.compile(r"^Traceback \(most recent call last\):\s*$")
_CHAIN = {
    "The above exception was the direct cause of the following exception:": "cause",
    "During handling of the above exception, another exception occurred:": "context",
}
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun's per-rank line prefix
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_ERRNO = re.compile(r"\[Errno (?P<n>-?\d+)\]")


def _parse_block(lines: list[str], head: int) -> tuple[p.ErrorLink | None, int]:
    """The exception line(s) after the frames of the traceback starting at `head`; and the index
    just past the block."""
    i = head + 1
    n = len(lines)
    while i < n and (lines[i].startswith(" ") or lines[i].startswith("\t")):
        i += 1
    if i >= n:
        return None, i
    m = _EXC_LINE.match(lines[i])
    if m is None:
        return None, i + 1
    msg_lines = [m.group("msg") or ""]
    j = i + 1
    while j < n and lines[j].strip() and not _TB_HEAD.match(lines[j]) and lines[j].strip() not in _CHAIN:
        msg_lines.append(lines[j])
        j += 1
    message = "\n".join(msg_lines).strip()
    link = p.ErrorLink(type=m.group("type"), message=message)
    em = _ERRNO.search(message)
    if em is not None:
        code = int(em.group("n"))
        link = p.ErrorLink(
            type=link.type, message=message, errno=code, errno_name=errno_mod.errorcode.get(code)
        )
    return link, j


def crash_from_log(text: str, t: float | None = None) -> p.Crash | None:
    """The last Python traceback in a trainer log as a Crash (outermost link first), following the
    "direct cause" and "During handling" chain back to its innermost error; None if there is none.
    `t` stamps the Crash (default: now)."""
    lines = [_PREFIX.sub("", ln.rstrip("\r")) for ln in text.splitlines()]
    heads = [i for i, ln in enumerate(lines) if _TB_HEAD.match(ln)]
    if not heads:
        return None
    last = heads[-1]
    link, end = _parse_block(lines, last)
    if link is None:
        return None
    chain = [link]
    first = last
    # Walk back: a chain sentence right above this traceback joins the one before it.
    while True:
        k = first - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k < 0 or lines[k].strip() not in _CHAIN:
            break
        prev_heads = [h for h in heads if h < k]
        if not prev_heads:
            break
        prev_link, _ = _parse_block(lines, prev_heads[-1])
        if prev_link is None:
            break
        chain.append(prev_link)
        first = prev_heads[-1]
    return p.Crash(
        t=time.time() if t is None else t, chain=chain, traceback="\n".join(lines[first:end]), source="log"
    )


# --------------------------------------------------------------------------- GPU


def _alloc_reserved(run: RunState) -> int | None:
    vals = [r.alloc_reserved for r in run.ranks.values() if r.alloc_reserved is not None]
    return sum(vals) if vals else None


def ghost_measure(run: RunState, ctx: WatchContext) -> dict[str, Any] | None:
    """Driver-attributed vs allocator-reserved bytes for the live attempt, or None when either
    side is unknown. Per-process where the driver reports our processes' memory, else device used."""
    gpu = ctx.gpu
    a = run.attempt
    if gpu is None or not gpu.available or a is None or not a.alive or ctx.alive is False:
        return None
    reserved = _alloc_reserved(run)
    if reserved is None or reserved <= 0:
        return None
    ours = gpu.ours
    known = [x.used_bytes for x in ours if x.used_bytes is not None]
    if ours and len(known) == len(ours):
        driver, basis = sum(known), "per-process"
        devices = sorted({x.device for x in ours})
    else:
        used = [d.used_bytes for d in gpu.devices if d.used_bytes is not None]
        if not used:
            return None
        # Other live processes' memory, where the driver does say it, is theirs, not a ghost.
        others = sum(
            x.used_bytes for x in gpu.processes if not x.ours and x.exists and x.used_bytes is not None
        )
        driver, basis = max(0, sum(used) - others), "device"
        devices = [d.index for d in gpu.devices if d.used_bytes is not None]
    return {
        "driver_bytes": driver,
        "reserved_bytes": reserved,
        "ratio": driver / reserved,
        "basis": basis,
        "devices": devices,
    }


def ghost_finding(
    measure: dict[str, Any] | None, streak: int, run: RunState, ctx: WatchContext
) -> Finding | None:
    th = ctx.thresholds
    if measure is None or streak < th.ghost_cycles:
        return None
    wsl = ctx.host is not None and ctx.host.wsl
    driver, reserved, ratio = measure["driver_bytes"], measure["reserved_bytes"], measure["ratio"]
    basis = (
        "the driver attributes"
        if measure["basis"] == "per-process"
        else "the device shows (per-process memory is N/A here, device totals stand in)"
    )
    if wsl:
        advice = (
            "under WSL2 the driver keeps dead contexts' memory until the VM restarts: "
            "stop the run, `wsl --shutdown` from Windows, resume"
        )
        action = None
    else:
        advice = "memory left by earlier crashed contexts: kill leftover processes of earlier attempts, then resume"
        action = "kill"
    previous = [x.pgid for x in run.attempts[:-1] if x.pgid > 0]
    return Finding(
        code="GHOST_MEMORY",
        severity="warning",
        action=action,
        message=(
            f"{basis} {fmt_bytes(driver)} but the allocator reserves {fmt_bytes(reserved)} "
            f"({ratio:.2f}x > {th.ghost_factor}x for {streak} probe cycles): {advice}"
        ),
        evidence={
            **measure,
            "ratio": round(ratio, 3),
            "factor": th.ghost_factor,
            "cycles": streak,
            "wsl": wsl,
            "previous_pgids": previous,
        },
    )


def _ours_computing(run: RunState, ctx: WatchContext, gpu: GpuSample) -> bool:
    a = run.attempt
    if a is None or not a.alive or ctx.alive is False:
        return False
    if gpu.ours:
        return True
    reserved = _alloc_reserved(run)
    if reserved:
        return True
    # No process list (WSL often gives none) or PIDs from another namespace: the busy device may
    # well be our own live trainer warming up, so it is not called an orphan.
    return not gpu.processes or gpu.pid_namespace != "host"


def busy_devices(run: RunState, ctx: WatchContext) -> list[GpuDevice]:
    """Devices at >= orphan_util_percent with no live compute process of ours and none that exists
    in our namespace: something dead is computing (the "100 % at 60 W, [Not Found]" wedge)."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available or _ours_computing(run, ctx, gpu):
        return []
    return [
        d
        for d in gpu.devices
        if d.util_percent is not None
        and d.util_percent >= ctx.thresholds.orphan_util_percent
        and not any(x.device == d.index and not x.gone for x in gpu.processes)
    ]


def orphan_candidates(ctx: WatchContext) -> list[GpuProcess]:
    """Compute processes the driver lists whose pid does not exist here or is a zombie. Only in the
    host PID namespace: elsewhere the driver's (host) PIDs need not exist here at all."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available or gpu.pid_namespace != "host":
        return []
    return [x for x in gpu.processes if x.gone]


def _device(gpu: GpuSample, index: int) -> GpuDevice:
    return next((d for d in gpu.devices if d.index == index), GpuDevice(index=index))


def orphan_findings(run: RunState, ctx: WatchContext, mem: Memory) -> list[Finding]:
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    found: list[Finding] = []
    previous = [x.pgid for x in run.attempts if x.pgid > 0 and x.ended_at is not None]
    for x in orphan_candidates(ctx):
        if mem.orphan_streak.get(x.pid, 0) < ctx.thresholds.orphan_cycles:
            continue  # a context being torn down right after its process exited
        what = "does not exist" if not x.exists else "is a zombie"
        dev = _device(gpu, x.device)
        found.append(
            Finding(
                code="ORPHAN_CONTEXT",
                severity="critical",
                action="kill",
                key=f"pid-{x.pid}",
                message=(
                    f"the driver lists compute pid {x.pid} holding {fmt_bytes(x.used_bytes)} on "
                    f"device {x.device}, and that pid {what}: a context that outlived its process"
                    + (
                        f" (device at {dev.util_percent} %, {dev.power_w} W)"
                        if dev.util_percent is not None
                        else ""
                    )
                    + "; kill the old process group and confirm the VRAM falls"
                ),
                evidence={
                    "pid": x.pid,
                    "used_bytes": x.used_bytes,
                    "device": x.device,
                    "exists": x.exists,
                    "state": x.state,
                    "device_used_bytes": dev.used_bytes,
                    "util_percent": dev.util_percent,
                    "power_w": dev.power_w,
                    "previous_pgids": previous,
                },
            )
        )
    for d in busy_devices(run, ctx):
        streak = mem.busy_streak.get(d.index, 0)
        if streak < ctx.thresholds.orphan_cycles:
            continue
        found.append(
            Finding(
                code="ORPHAN_CONTEXT",
                severity="critical",
                action="kill",
                key=f"device-{d.index}",
                message=(
                    f"device {d.index} is {d.util_percent} % busy at {d.power_w} W with "
                    f"{fmt_bytes(d.used_bytes)} used, and no live compute process of ours: a zombie "
                    "context holds the GPU; kill the old process group and confirm the VRAM falls"
                ),
                evidence={
                    "device": d.index,
                    "util_percent": d.util_percent,
                    "power_w": d.power_w,
                    "used_bytes": d.used_bytes,
                    "total_bytes": d.total_bytes,
                    "cycles": streak,
                    "driver_pids": [x.pid for x in gpu.processes if x.device == d.index],
                    "previous_pgids": previous,
                },
            )
        )
    return found


# --------------------------------------------------------------------------- host, locks, duplicates


def host_ram_low(run: RunState, ctx: WatchContext) -> Finding | None:
    host = ctx.host
    th = ctx.thresholds
    if host is None or not host.available:
        return None
    avail = host.effective_available_bytes
    if avail is None or avail >= th.host_ram_low_bytes:
        return None
    cg = host.cgroup
    where = "host"
    if cg is not None and cg.available_bytes is not None and cg.available_bytes == avail and cg.limit_bytes:
        where = f"cgroup (limit {fmt_bytes(cg.limit_bytes)})"
    a = run.attempt
    enomem = a is not None and any(errno_name(x) == "ENOMEM" for x in (a.crash.chain if a.crash else []))
    return Finding(
        code="HOST_RAM_LOW",
        severity="critical" if enomem else "warning",
        action="reclaim",
        message=(
            f"{where} RAM low: {fmt_bytes(avail)} available (< {fmt_bytes(th.host_ram_low_bytes)}); "
            f"{fmt_bytes(host.page_cache_bytes)} in the page cache could be reclaimed; torch.load of a "
            "checkpoint fails with ENOMEM below this"
        ),
        evidence={
            "available_bytes": avail,
            "threshold_bytes": th.host_ram_low_bytes,
            "page_cache_bytes": host.page_cache_bytes,
            "mem_total_bytes": host.mem_total_bytes,
            "mem_available_bytes": host.mem_available_bytes,
            "cgroup_limit_bytes": cg.limit_bytes if cg is not None else None,
            "cgroup_usage_bytes": cg.usage_bytes if cg is not None else None,
            "wsl": host.wsl,
        },
    )


def stale_locks(run: RunState, ctx: WatchContext) -> list[Finding]:
    """STALE_LOCK: a configured lock whose holder is dead, a zombie, or not the current attempt."""
    a = run.attempt
    # Holders read before the attempt last started or ended describe the run as it was then (a
    # trainer that still held its own lock): wait for a cycle that postdates the change.
    if a is not None and ctx.probe_t is not None and ctx.probe_t < max(a.started_at, a.ended_at or 0.0):
        return []
    # Only a live attempt's processes may hold the lock; after a death every holder is stale.
    current: set[int] = set()
    if a is not None and a.alive and ctx.alive is not False:
        current = set(ctx.attempt_pids) | ({a.pid} if a.pid > 0 else set())
    out = []
    for lk in ctx.locks:
        for h in lk.holders:
            why = _stale_because(h, current)
            if why is not None:
                out.append(_stale_lock_finding(lk, h, why))
                break  # one finding per lock file
    return out


def _stale_because(h: LockHolder, current: set[int]) -> str | None:
    """Why a holder's lock is stale; None when it belongs to the live attempt."""
    if not h.exists:
        return f"pid {h.pid} no longer exists" if h.pid > 0 else "its owner is not visible here (pid 0)"
    if h.gone:
        return f"pid {h.pid} is a zombie"
    if h.pid in current:
        return None
    return f"pid {h.pid} ({h.comm}, state {h.state}) is not the current attempt"


def _stale_lock_finding(lk: LockInfo, h: LockHolder, why: str) -> Finding:
    inheritors = lk.inheritors
    inherit_txt = ""
    if inheritors:
        inherit_txt = "; still held through an inherited descriptor by " + ", ".join(
            f"pid {k.pid} ({k.comm}, state {k.state}, pgid {k.pgid})" for k in inheritors
        )
    kill_pids = [k.pid for k in inheritors] or ([h.pid] if h.exists and h.pid else [])
    return Finding(
        code="STALE_LOCK",
        severity="critical",
        action="kill",
        key=lk.path,
        message=f"{h.kind or 'lock'} on {lk.path} held by pid {h.pid}: {why}{inherit_txt}; "
        "a relaunch cannot take it",
        evidence={
            "path": lk.path,
            "lock_key": lk.key,
            "holder_pid": h.pid,
            "holder_state": h.state,
            "holder_exists": h.exists,
            "kind": h.kind,
            "mode": h.mode,
            "inheritors": [msgspec.to_builtins(k) for k in inheritors],
            "kill_pids": kill_pids,
            "kill_pgids": sorted({k.pgid for k in inheritors if k.pgid}),
            "waiters": lk.waiters,
        },
    )


def duplicate_findings(ctx: WatchContext) -> list[Finding]:
    out = []
    for d in ctx.duplicates:
        if d.kind == "host":
            out.append(
                Finding(
                    code="DUPLICATE_TRAINER",
                    severity="warning",
                    action="kill",
                    key=f"host:{d.name}",
                    message=(
                        f"{len(d.pids)} instances of {d.name} (pids {', '.join(map(str, d.pids))}): "
                        "a session that was not released holds its memory"
                    ),
                    evidence={"kind": "host", "name": d.name, "pids": d.pids, "others": d.others},
                )
            )
            continue
        if not d.others:
            continue
        mine = f"ours is pid {d.ours}" if d.ours else "our attempt is not running"
        out.append(
            Finding(
                code="DUPLICATE_TRAINER",
                severity="warning",
                action="kill",
                key="trainer",
                message=(
                    f"another process runs the same command in {d.cwd}: pid {', '.join(map(str, d.others))} "
                    f"({mine}); two trainers share the GPU and the checkpoint directory"
                ),
                evidence={
                    "kind": "trainer",
                    "pids": d.pids or d.others,
                    "ours": d.ours,
                    "others": d.others,
                    "cmdline": d.cmdline,
                    "cwd": d.cwd,
                },
            )
        )
    return out


# --------------------------------------------------------------------------- the watchdog


# Findings whose figures move while the condition lasts (a growing gap, a ratio per sample). The
# keeper journals a finding again whenever its message changes, so their message keeps the
# figures of first detection while the cause and severity stay; the evidence stays live.
VOLATILE = frozenset({"STALLED", "HUNG", "SLOW", "GHOST_MEMORY", "HOST_RAM_LOW", "ORPHAN_CONTEXT"})


class Watchdog:
    """Runs every rule; keeps the little that must persist between calls (see Memory)."""

    def __init__(self) -> None:
        self.memory = Memory()
        self._pinned: dict[str, tuple[str, str, str]] = {}  # ident -> (severity, cause, message)

    def _pin(self, findings: list[Finding]) -> None:
        pinned: dict[str, tuple[str, str, str]] = {}
        for f in findings:
            if f.code not in VOLATILE:
                continue
            sig = (f.severity, str(f.evidence.get("cause", "")))
            old = self._pinned.get(f.ident)
            if old is not None and old[:2] == sig:
                f.message = old[2]
            pinned[f.ident] = (*sig, f.message)
        self._pinned = pinned

    def observe(self, run: RunState, ctx: WatchContext, now: float) -> None:
        """Update the cross-call memory from this call's observations (the only writer)."""
        m = self.memory
        a = run.attempt
        n = a.n if a is not None else 0
        if n != m.attempt:
            self.memory = m = Memory(attempt=n)
        # D state must persist to count: any other state resets the clock.
        for pid in list(m.d_since):
            if ctx.proc_states.get(pid) != "D":
                del m.d_since[pid]
        for pid, st in ctx.proc_states.items():
            if st == "D":
                m.d_since.setdefault(pid, now)
        for pid, counter in ctx.activity.items():
            if m.activity.get(pid) != counter:
                m.activity[pid], m.active_at[pid] = counter, now
        if ctx.activity:
            m.activity_t = ctx.probe_t
        t = ctx.gpu.t if ctx.gpu is not None else None
        if t is not None and t != m.gpu_t:
            m.gpu_t = t  # a new probe cycle: streaks advance once per sample, not per tick
            g = ghost_measure(run, ctx)
            th = ctx.thresholds
            if (
                g is not None
                and g["ratio"] > th.ghost_factor
                and g["driver_bytes"] - g["reserved_bytes"] >= th.ghost_min_excess_bytes
            ):
                m.ghost_streak += 1
            else:
                m.ghost_streak = 0
            busy = {d.index for d in busy_devices(run, ctx)}
            m.busy_streak = {i: m.busy_streak.get(i, 0) + 1 for i in busy}
            gone = {x.pid for x in orphan_candidates(ctx)}
            m.orphan_streak = {pid: m.orphan_streak.get(pid, 0) + 1 for pid in gone}

    def evaluate(self, run: RunState, ctx: WatchContext, now: float) -> Verdict:
        self.observe(run, ctx, now)
        m = self.memory
        a = run.attempt
        findings: list[Finding] = []
        if a is None:
            state, reason = "starting", "no attempt yet"
        elif a.ended_at is not None:
            state, reason, found = _ended_verdict(run, a, ctx)
            findings += found
        elif ctx.alive is False:
            state, reason = "dead", f"attempt {a.n}: process gone, exit status not yet known"
            findings.append(dead_finding(run, a, ctx))
        else:
            state, reason, found = progress(run, ctx, now, m)
            findings += found
        if a is not None:
            rd = repeat_death(run, ctx.thresholds)
            if rd is not None:
                findings.append(rd)
            me = masked_error(a, ctx.log_crash)
            if me is not None:
                findings.append(me)
        g = ghost_finding(ghost_measure(run, ctx), m.ghost_streak, run, ctx)
        if g is not None:
            findings.append(g)
        findings += orphan_findings(run, ctx, m)
        h = host_ram_low(run, ctx)
        if h is not None:
            findings.append(h)
        findings += stale_locks(run, ctx)
        findings += duplicate_findings(ctx)
        self._pin(findings)
        return Verdict(state=state, reason=reason, findings=findings)


def context_from_probe(
    sample: p.ProbeSample | None,
    *,
    thresholds: Thresholds | None = None,
    alive: bool | None = None,
    attempt_pids: Iterable[int] = (),
    log_crash: p.Crash | None = None,
    attempt: int | None = None,
) -> WatchContext:
    """A WatchContext from the keeper's latest ProbeSample. Given `attempt`, process states
    sampled for another attempt (the cycle that straddled a resume) are left out."""
    th = thresholds or Thresholds()
    if sample is None:
        return WatchContext(thresholds=th, alive=alive, attempt_pids=list(attempt_pids), log_crash=log_crash)
    procs = sample.procs or ProcsSample()
    stale = attempt is not None and sample.procs is not None and procs.attempt not in (0, attempt)
    states = {} if stale else dict(procs.states)
    return WatchContext(
        thresholds=th,
        alive=alive,
        attempt_pids=list(attempt_pids) or sorted(states),
        gpu=sample.gpu,
        host=sample.host,
        proc_states=states,
        activity={} if stale else dict(procs.activity),
        locks=list(procs.locks),
        duplicates=list(procs.duplicates),
        log_crash=log_crash,
        probe_t=sample.t,
    )


__all__ = [
    "STATES",
    "Memory",
    "Thresholds",
    "Verdict",
    "WatchContext",
    "Watchdog",
    "context_from_probe",
    "crash_from_log",
    "median_interval",
    "progress_bound",
]
