"""Progress of a live attempt: running, slow, stalled or hung, with the STALLED / HUNG / SLOW
finding that says why.

STALLED is "alive and beating but not stepping" (scenario 2's accumulation counter); HUNG is
"alive and not even beating", or stopped (T), or stuck in the kernel (D), or a main thread parked
on one line. Every gap is judged against the bounds of `run.figures` (the same ones `status` and
the control room show): max(stall_factor x median step interval, stall_floor_s) once the median
is known, the warm-up bound before, a phase's own bound inside a phase.

The reason (what RunStatus journals on each change) holds no growing figure, so it changes only
when the diagnosis does; the finding's message carries the figures.
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.health.gpufaults import throttled_devices
from trainroom.core.logs.loglines import unread_words
from trainroom.core.run.figures import median_interval, phase_bound, progress_bound, warmup_bound
from trainroom.core.run.parts import AttemptView, RankView
from trainroom.core.run.state import RunState
from trainroom.core.samples import GONE_STATES, Worker
from trainroom.core.units import fmt_duration
from trainroom.core.vocab import ActionName, WatchState

# A state, its reason, and the findings that go with it.
Judgement = tuple[WatchState, str, list[Finding]]
Evidence = dict[str, Any]


class Overrun(NamedTuple):
    """A rank past one of its bounds: how far past (gap / bound), the reason and the message."""

    ratio: float
    reason: str
    message: str
    evidence: Evidence


def _worse(a: Overrun | None, b: Overrun | None) -> Overrun | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if b.ratio > a.ratio else a


def hung_finding(message: str, evidence: Evidence) -> Finding:
    # The fix that fits the cause: a stopped process runs on after SIGCONT (its stacks are
    # where it stopped: nothing to learn from a dump); any other hang is read from its stacks.
    action: ActionName = "continue" if evidence.get("cause") == "stopped" else "dump"
    return Finding(code="HUNG", severity="critical", message=message, action=action, evidence=evidence)


def _stalled(a: AttemptView, reason: str, message: str, evidence: Evidence, ctx: WatchContext) -> Judgement:
    odd = {pid: st for pid, st in ctx.proc_states.items() if st in ("T", "t", "D", "Z")}
    if odd:
        evidence = {**evidence, "odd_processes": {str(k): v for k, v in sorted(odd.items())}}
    finding = Finding(
        code="STALLED",
        severity="warning",
        message=message,
        action="dump",
        evidence={**evidence, "attempt": a.n},
    )
    return "stalled", reason, [finding]


def _watched_pids(a: AttemptView, run: RunState, ctx: WatchContext) -> list[int]:
    """The leader, every rank the reporter named, and every worker the process tree gave."""
    pids = {a.pid} | {r.pid for r in run.ranks.values() if r.pid} | {w.pid for w in ctx.workers}
    return sorted(x for x in pids if x and x > 0)


def _rank_of(pid: int, run: RunState, ctx: WatchContext) -> int | None:
    rank = ctx.worker_rank(pid)
    if rank is None:
        rank = next((r.rank for r in run.ranks.values() if r.pid == pid), None)
    return rank


def _who(pid: int, rank: int | None) -> str:
    return f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"


def _live_workers(ctx: WatchContext) -> list[Worker]:
    return [w for w in ctx.workers if w.state not in GONE_STATES]


# --------------------------------------------------------------------------- stopped, stuck, silent


def _stopped_or_stuck(
    run: RunState, a: AttemptView, ctx: WatchContext, now: float, mem: Memory, bound: float | None
) -> Judgement | None:
    """Stopped (T/t) or stuck in the kernel (D past its bound): no progress is possible whatever
    the telemetry says."""
    th = ctx.thresholds
    d_bound = th.d_state_bound_s if th.d_state_bound_s is not None else (bound or th.stall_floor_s)
    for pid in _watched_pids(a, run, ctx):
        st = ctx.proc_states.get(pid)
        rank = _rank_of(pid, run, ctx)
        who = _who(pid, rank)
        if st in ("T", "t"):
            why = "SIGSTOP or a debugger" if st == "T" else "being traced"
            message = f"{who} is stopped (state {st}: {why}); it makes no progress until SIGCONT"
            evidence: Evidence = {
                "cause": "stopped",
                "pid": pid,
                "rank": rank,
                "state": st,
                "last_step": a.last_step,
            }
            return "hung", f"{who} stopped (state {st})", [hung_finding(message, evidence)]
        if st == "D" and pid in mem.d_since and now - mem.d_since[pid] > d_bound:
            held = now - mem.d_since[pid]
            message = (
                f"{who} has sat in uninterruptible I/O (state D) for {fmt_duration(held)} "
                f"(bound {fmt_duration(d_bound)}): a stuck filesystem or driver call"
            )
            evidence = {
                "cause": "d-state",
                "pid": pid,
                "rank": rank,
                "state": "D",
                "for_s": round(held, 1),
                "bound_s": d_bound,
                "last_step": a.last_step,
            }
            return (
                "hung",
                f"{who} stuck in uninterruptible I/O (state D)",
                [hung_finding(message, evidence)],
            )
    return None


def main_frame_age(r: RankView, now: float) -> float | None:
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
    if active_at is None or not mem.activity_fresh(now, th):
        return False
    limit = moved_at + th.park_slack_s
    return frame_since <= limit and active_at <= limit


def _heartbeat_bound(r: RankView, stepped: bool, bound: float | None, grace: float, th: Thresholds) -> float:
    pb = phase_bound(r, th)
    if pb is not None:
        return pb
    if stepped and bound is not None:
        return bound
    return grace  # before the first steps (imports, compile, data): the start grace


def _silent(r: RankView, a: AttemptView, hb_bound: float, now: float) -> Overrun | None:
    beats = [t for t in (r.last_heartbeat_t, r.last_step_t, r.phase_since) if t is not None]
    silent = now - (max(beats) if beats else a.started_at)
    if silent <= hb_bound:
        return None
    return Overrun(
        silent / hb_bound,
        f"rank {r.rank} silent: no heartbeat within {fmt_duration(hb_bound)}",
        f"rank {r.rank} alive but silent: no heartbeat (nor step) for {fmt_duration(silent)} "
        f"(bound {fmt_duration(hb_bound)}); last step {r.step}",
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


def _parked_frame(
    r: RankView, a: AttemptView, hb_bound: float, now: float, mem: Memory, th: Thresholds
) -> Overrun | None:
    age = main_frame_age(r, now)
    if age is None or age <= hb_bound:
        return None
    parked = mem.main_thread_parked(r.pid or a.pid, now, hb_bound, th)
    if parked is False:  # a main thread that keeps running (a loop that never steps) is a stall
        return None
    return Overrun(
        age / hb_bound,
        f"rank {r.rank}: main thread parked on {r.main_frame}",
        f"rank {r.rank}: heartbeats flow but the main thread has sat on {r.main_frame} for "
        f"{fmt_duration(age)} (bound {fmt_duration(hb_bound)}): a deadlock or a blocking call",
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


def _silent_or_parked(
    a: AttemptView,
    ranks: list[RankView],
    stepped: bool,
    bound: float | None,
    grace: float,
    now: float,
    mem: Memory,
    th: Thresholds,
) -> Overrun | None:
    """HUNG for an instrumented attempt: a rank with no heartbeat (nor step) within its bound, or
    whose main thread has sat on one line past it while nothing says the thread still runs."""
    worst: Overrun | None = None
    for r in ranks:
        hb_bound = _heartbeat_bound(r, stepped, bound, grace, th)
        silent = _silent(r, a, hb_bound, now)
        worst = _worse(worst, silent if silent is not None else _parked_frame(r, a, hb_bound, now, mem, th))
    return worst


# --------------------------------------------------------------------------- before the first step


def _before_first_step(a: AttemptView, ranks: list[RankView], now: float, ctx: WatchContext) -> Judgement:
    th = ctx.thresholds
    in_phase = [(r, pb) for r in ranks if (pb := phase_bound(r, th)) is not None]
    for r, pb in in_phase:
        since = now - (r.phase_since or a.started_at)
        if since > pb:
            return _stalled(
                a,
                f"{r.phase} phase over its {fmt_duration(pb)} bound",
                f"{r.phase} phase for {fmt_duration(since)}, over its bound {fmt_duration(pb)}",
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
        return "starting", f"{r.phase} phase (bound {fmt_duration(pb)})", []
    if not a.instrumented:
        if now - a.started_at <= th.start_grace_s:
            # Not "uninstrumented" yet: an instrumented trainer's reporter connects only once
            # its imports are done, seconds in.
            return "starting", "no step yet: waiting for the first report or a step in the log", []
        return "running", "uninstrumented: no step telemetry in the log; watching life only", []
    ref = max([a.started_at] + [r.phase_since for r in ranks if r.phase_since is not None])
    waited = now - ref
    if waited <= th.start_grace_s:
        return "starting", "no step yet", []
    return _stalled(
        a,
        f"alive, heartbeats flowing, no first step within the {fmt_duration(th.start_grace_s)} start grace",
        f"alive, heartbeats flowing, no first step after {fmt_duration(waited)} "
        f"(start grace {fmt_duration(th.start_grace_s)})",
        {
            "cause": "no-first-step",
            "waited_s": round(waited, 1),
            "bound_s": th.start_grace_s,
            "last_step": None,
        },
        ctx,
    )


# --------------------------------------------------------------------------- step gaps


def _phase_overrun(r: RankView, pb: float, now: float) -> Overrun | None:
    assert r.last_step_t is not None
    since = now - (r.phase_since or r.last_step_t)
    if since <= pb:
        return None
    return Overrun(
        since / pb,
        f"{r.phase} phase over its {fmt_duration(pb)} bound",
        f"{r.phase} phase for {fmt_duration(since)}, over its bound {fmt_duration(pb)}",
        {
            "cause": "phase",
            "rank": r.rank,
            "phase": r.phase,
            "phase_s": round(since, 1),
            "bound_s": pb,
            "last_step": r.step,
        },
    )


def _step_gap(
    r: RankView, a: AttemptView, step_bound: float, bound_txt: str, median: float | None, now: float
) -> Overrun | None:
    assert r.last_step_t is not None
    # A phase that just ended restarts the clock: the next step is on its way.
    gap = now - max(r.last_step_t, r.phase_since or 0.0)
    if gap <= step_bound:
        return None
    beats = "heartbeats flowing" if a.instrumented else "process running (uninstrumented)"
    return Overrun(
        gap / step_bound,
        f"alive, {beats}, no step within {fmt_duration(step_bound)}",
        f"alive, {beats}, no step for {fmt_duration(gap)} ({bound_txt})",
        {
            "cause": "no-step",
            "rank": r.rank,
            "gap_s": round(gap, 1),
            "bound_s": step_bound,
            "median_s": median,
            "last_step": r.step,
        },
    )


def _worst_gap(
    a: AttemptView,
    stepped: list[RankView],
    bound: float | None,
    grace: float,
    median: float | None,
    now: float,
    th: Thresholds,
) -> Overrun | None:
    """The rank furthest past its bound: a phase's own inside a phase, the step bound outside
    (only ranks that step count: some setups report steps from rank 0 only)."""
    step_bound = bound if bound is not None else grace
    if bound is not None and median is not None:
        bound_txt = (
            f"bound {fmt_duration(step_bound)} = max({th.stall_factor:g} x median step {median:.2f} s, "
            f"floor {fmt_duration(th.stall_floor_s)})"
        )
    else:
        bound_txt = f"warm-up bound {fmt_duration(step_bound)}"
    worst: Overrun | None = None
    for r in stepped:
        pb = phase_bound(r, th)
        gap = (
            _phase_overrun(r, pb, now)
            if pb is not None
            else _step_gap(r, a, step_bound, bound_txt, median, now)
        )
        worst = _worse(worst, gap)
    return worst


def _judge_gap(
    run: RunState,
    a: AttemptView,
    worst: Overrun,
    step_bound: float,
    ctx: WatchContext,
    mem: Memory,
    now: float,
) -> Judgement:
    """A rank past its bound: a hang when its main thread is parked, else a stall."""
    th = ctx.thresholds
    # Heartbeats flow but the main thread has sat on one line, not running, since its last step:
    # the gap is a park (a deadlock), not a loop that never steps. Said at the step bound, not a
    # heartbeat later when the frame's own age passes it.
    r = run.ranks.get(worst.evidence["rank"])
    if a.instrumented and r is not None and _parked_since_last_step(r, a, mem, now, th):
        age = main_frame_age(r, now) or 0.0
        message = (
            f"rank {r.rank}: heartbeats flow but the main thread has sat on {r.main_frame} since step {r.step}, "
            f"for {fmt_duration(age)} (bound {fmt_duration(step_bound)}): a deadlock or a blocking call"
        )
        evidence: Evidence = {
            "cause": "main-frame",
            "rank": r.rank,
            "pid": r.pid,
            "main_frame": r.main_frame,
            "main_frame_age_s": round(age, 1),
            "bound_s": step_bound,
            "last_step": r.step,
            "main_thread_parked": True,
        }
        return (
            "hung",
            f"rank {r.rank}: main thread parked on {r.main_frame}",
            [hung_finding(message, evidence)],
        )
    # Without heartbeats, a main thread that has not run for the whole bound is parked: a hang.
    # Under a launcher (torchrun) the ranks' main threads tell, not the launcher's own loop.
    workers = _live_workers(ctx)
    if not a.instrumented and workers:
        return _judge_workers(a, worst, workers, step_bound, ctx, mem, now)
    if not a.instrumented and mem.main_thread_parked(a.pid, now, step_bound, th):
        message = (
            f"{worst.message}; the main thread of pid {a.pid} has not run for over {fmt_duration(step_bound)}: "
            "blocked (a lock, a pipe, a peer)"
        )
        evidence = {**worst.evidence, "cause": "parked", "pid": a.pid}
        reason = f"no step within {fmt_duration(step_bound)} and the main thread is parked"
        return "hung", reason, [hung_finding(message, evidence)]
    return _stalled(a, worst.reason, worst.message, worst.evidence, ctx)


def _judge_workers(
    a: AttemptView,
    worst: Overrun,
    workers: list[Worker],
    step_bound: float,
    ctx: WatchContext,
    mem: Memory,
    now: float,
) -> Judgement:
    """An uninstrumented run under a launcher, past its step bound: hung when no rank's main
    thread has run for the whole bound (a collective waiting on a peer, a lock), else a stall
    (one rank still works: an evaluation, a slow save, a loop that never steps)."""
    th = ctx.thresholds
    if not all(mem.main_thread_parked(w.pid, now, step_bound, th) for w in workers):
        return _stalled(a, worst.reason, worst.message, worst.evidence, ctx)
    names = ", ".join(_who(w.pid, w.rank) for w in workers)
    message = (
        f"{worst.message}; the main threads of {names} have not run for over {fmt_duration(step_bound)}: "
        "blocked (a collective waiting on a peer, a lock)"
    )
    evidence = {
        **worst.evidence,
        "cause": "parked",
        "ranks": [w.rank for w in workers],
        "pids": [w.pid for w in workers],
    }
    reason = f"no step within {fmt_duration(step_bound)} and every rank's main thread is parked"
    return "hung", reason, [hung_finding(message, evidence)]


# --------------------------------------------------------------------------- SLOW


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


# --------------------------------------------------------------------------- the verdict


def progress(run: RunState, ctx: WatchContext, now: float, mem: Memory) -> Judgement:
    """The state of a live attempt and its STALLED / HUNG / SLOW finding."""
    a = run.attempt
    assert a is not None
    th = ctx.thresholds
    median = median_interval(run, th)
    bound = progress_bound(median, th)
    grace = warmup_bound(th)
    stuck = _stopped_or_stuck(run, a, ctx, now, mem, bound)
    if stuck is not None:
        return stuck
    if a.bye is not None:
        return "running", f"trainer said bye ({a.bye}); waiting for it to exit", []
    ranks = list(run.ranks.values())
    stepped = [r for r in ranks if r.last_step_t is not None]
    if a.instrumented:
        hung = _silent_or_parked(a, ranks, bool(stepped), bound, grace, now, mem, th)
        if hung is not None:
            return "hung", hung.reason, [hung_finding(hung.message, hung.evidence)]
    if not stepped:
        shown, reason, found = _before_first_step(a, ranks, now, ctx)
        if not a.instrumented and run.log_unread_lines:  # the log is there, its shape unknown
            reason = f"uninstrumented: {unread_words(run.log_unread_lines)}"
        return shown, reason, found
    worst = _worst_gap(a, stepped, bound, grace, median, now, th)
    if worst is not None:
        return _judge_gap(run, a, worst, bound if bound is not None else grace, ctx, mem, now)
    slow = slow_check(stepped, th)
    if slow is not None:
        hot = throttled_devices(ctx)
        if hot:  # the step rate fell with the GPU's clocks: that is the cause, in its words
            why = "; ".join(f"GPU {d.index} {words}" for d, words in hot)
            slow.message = slow.message.split("; ghost VRAM")[0] + f": the GPU is throttled ({why})"
            slow.evidence |= {"cause": "GPU throttled", "throttled": why}
        return "slow", f"steps slower than {th.slow_factor:g} x the median", [slow]
    return "running", "steps flowing", []
