"""The watchdog: the run's state (starting, running, slow, stalled, hung, dead, exited) and the
findings about life, progress, the GPU, host RAM, locks, duplicates and crash causes.

Every rule is a pure function of the run (`state.RunState`, the fold every client sees), the
latest probe results (`WatchContext`) and the clock `now`; each lives in the module named for
what it judges (life, progress, gpu, host, crash) and is listed once in `rules.WATCHDOG`, after
the state rule here. What must outlive one call lives in a small
`Memory` the `Watchdog` object keeps, not in globals. The keeper calls `Watchdog.evaluate` every
tick, diffs the findings against what is open, and stamps first/last seen.

Wiring (the keeper, one Watchdog per run, all on the event-loop thread except the probe cycle):

    sweep = probes.sweep.ProbeSweep(lock_paths=cfg.lock_files)          # once
    sample = sweep.sample(targets_of(run))                                # worker thread, ~1 s
    keeper.emit(sample, journal=False)                                   # -> run.probe
    ctx = context_from_probe(run.probe, thresholds=cfg.thresholds,
                             alive=<child not yet reaped>, attempt=run.attempt.n)
    verdict = watchdog.evaluate(run, ctx, now)                           # every tick (0.1-0.25 s)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import msgspec

from trainroom.core import vocab
from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.health.crash import crash_from_log, repeat_death
from trainroom.core.health.gpu import busy_devices, ghost_measure, ghost_seen, orphan_candidates
from trainroom.core.health.guard import Guard
from trainroom.core.health.life import dead_finding, dying_verdict, ended_verdict, fatal_worker
from trainroom.core.health.progress import Judgement, progress
from trainroom.core.health.rules import WATCHDOG, Watched, judge
from trainroom.core.run.ended import NOT_YET_KNOWN, attempt_ended, clean_exit
from trainroom.core.run.figures import median_interval, progress_bound
from trainroom.core.run.handlers.ranks import INTERVALS
from trainroom.core.run.state import RunState
from trainroom.core.samples import ProcsSample
from trainroom.core.wire import protocol as p

STATES = vocab.WATCH_STATES

# Findings whose figures move while the condition lasts (a growing gap, a ratio per sample). The
# keeper journals a finding again whenever its message changes, so their message keeps the
# figures of first detection while the cause and severity stay; the evidence stays live.
VOLATILE = vocab.VOLATILE

# The keeper's own stall: two evaluations this far apart (monotonic; they run every tick) mean
# the keeper itself did not run (SIGSTOP, a debugger, swap, a blocked loop). What it missed (the
# frames waiting on its socket, a fresh probe) is read first, for SETTLE_S and until a probe newer
# than the resume, at most SETTLE_MAX_S: until then its own gap is not the trainer's.
PAUSE_S = 2.0
SETTLE_S = 2.0
SETTLE_MAX_S = 10.0
JUDGED_STATES = frozenset({"hung", "stalled", "slow"})
JUDGED_CODES = frozenset({"HUNG", "STALLED", "SLOW"})


class Pause(msgspec.Struct, kw_only=True, frozen=True):
    """The keeper itself did not run for `gap_s`, until `t` (wall clock)."""

    t: float
    gap_s: float


class Verdict(msgspec.Struct, kw_only=True):
    state: vocab.WatchState
    reason: str
    findings: list[Finding] = []


class Watchdog:
    """Runs every rule; keeps the little that must persist between calls (see Memory)."""

    def __init__(self, guard: Guard | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.guard = guard if guard is not None else Guard()
        self._last: tuple[vocab.WatchState, str] = ("starting", "no attempt yet")
        self.memory = Memory()
        self._pinned: dict[str, tuple[str, str, str, str]] = {}  # ident -> (severity, cause, fix, message)
        self._clock = clock
        self._mono: float | None = None  # the last evaluation, on the monotonic clock
        self._pause: Pause | None = None  # the latest stall of the keeper itself, while settling
        self._settle_until = 0.0
        self._settle_max = 0.0
        self._before: tuple[vocab.WatchState, str] = self._last  # the verdict before the stall
        # rank -> steps_seen from which SLOW judges again: the intervals around the stall (its gap,
        # then a burst of frames read at once) are not the trainer's cadence until they rolled out.
        self._slow_from: dict[int, int] = {}
        self._slow_attempt = 0
        self.pauses: list[Pause] = []  # stalls seen, for the keeper to say (it clears the list)

    def _pin(self, findings: list[Finding]) -> None:
        pinned: dict[str, tuple[str, str, str, str]] = {}
        for f in findings:
            if f.code not in VOLATILE:
                continue
            # What the words say must stay true: a new cause, severity or fix (its target) re-words.
            target = f.target.label if f.target is not None else ""
            sig = (f.severity, str(f.evidence.get("cause", "")), f"{f.action}:{target}")
            old = self._pinned.get(f.ident)
            if old is not None and old[:3] == sig:
                f.message = old[3]
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
            m.ghost_streak = m.ghost_streak + 1 if ghost_seen(ghost_measure(run, ctx), ctx) else 0
            busy = {d.index for d in busy_devices(run, ctx)}
            m.busy_streak = {i: m.busy_streak.get(i, 0) + 1 for i in busy}
            gone = {x.pid for x in orphan_candidates(ctx)}
            m.orphan_streak = {pid: m.orphan_streak.get(pid, 0) + 1 for pid in gone}

    def evaluate(self, run: RunState, ctx: WatchContext, now: float) -> Verdict:
        """Every rule, each through the guard: one that raises is an INTERNAL_ERROR finding and
        the others still judge (the life rules above all: a dead trainer is DEAD regardless)."""
        g = self.guard
        self._own_gap(now)
        g.call("watchdog.memory", lambda: self.observe(run, ctx, now), None)
        judged = g.call("watchdog.state", lambda: self._state(run, ctx, now), None)
        if judged is not None:
            state, reason, findings = self._rebaselined(run, ctx, judged)
            self._last = (state, reason)
        else:
            state, reason, findings = self._fallback_state(run, ctx)
        findings += judge(g, WATCHDOG, Watched(run=run, ctx=ctx, memory=self.memory), now)
        self._pin(findings)
        return Verdict(state=state, reason=reason, findings=findings)

    # ------------------------------------------------------------------ the keeper's own stall

    def _own_gap(self, now: float) -> None:
        mono = self._clock()
        gap = mono - self._mono if self._mono is not None else 0.0
        self._mono = mono
        if gap <= PAUSE_S:
            return
        if self._pause is None:
            self._before = self._last
        self._pause = Pause(t=now, gap_s=gap)
        self.pauses.append(self._pause)
        self._settle_until, self._settle_max = mono + SETTLE_S, mono + SETTLE_MAX_S

    def _settling(self, ctx: WatchContext) -> bool:
        if self._pause is None:
            return False
        mono = self._mono or 0.0
        stale_probe = ctx.probe_t is not None and ctx.probe_t <= self._pause.t
        if mono < self._settle_until or (stale_probe and mono < self._settle_max):
            return True
        self._pause = None
        return False

    def _rebaselined(self, run: RunState, ctx: WatchContext, judged: Judgement) -> Judgement:
        """A stalled/hung/slow verdict that only the keeper's own stall could have made is not
        given: the verdict from before the stall stands while it catches up, and SLOW waits until
        the intervals around the stall have rolled out of each rank's window."""
        state, _reason, findings = judged
        a = run.attempt
        n = a.n if a is not None else 0
        if n != self._slow_attempt:
            self._slow_attempt, self._slow_from = n, {}
        if self._settling(ctx):
            self._slow_from = {k: r.steps_seen + INTERVALS for k, r in run.ranks.items()}
            if state in JUDGED_STATES and self._before[0] not in JUDGED_STATES:
                gap = self._pause.gap_s if self._pause is not None else 0.0
                why = f"the keeper itself did not run for {gap:.0f} s; catching up before judging"
                return self._before[0], f"{self._before[1]} ({why})", _unjudged(findings)
            return judged
        if state == "slow" and any(r.steps_seen < self._slow_from.get(k, 0) for k, r in run.ranks.items()):
            return (
                "running",
                "steps flowing (the cadence is measured again after the keeper's own stall)",
                [f for f in findings if f.code != "SLOW"],
            )
        return judged

    def _state(self, run: RunState, ctx: WatchContext, now: float) -> Judgement:
        a = run.attempt
        if a is None:
            return "starting", "no attempt yet", []
        if a.ended_at is not None:
            return ended_verdict(run, a, ctx)
        if ctx.alive is False:
            return (
                "dead",
                f"attempt {a.n}: {NOT_YET_KNOWN}",
                [dead_finding(run, a, ctx)],
            )
        if (fatal := fatal_worker(run, a)) is not None:
            return dying_verdict(run, a, fatal, ctx)
        return progress(run, ctx, now, self.memory)

    def _fallback_state(self, run: RunState, ctx: WatchContext) -> Judgement:
        """The state when its own rule raised: life from the bare facts (an ended attempt, a
        process gone), else the last state known, said to be stale."""
        a = run.attempt
        if a is not None and a.stopped:
            return "stopped", f"attempt {a.n} stopped by {a.stop_by} (the state rule failed)", []
        if a is not None and (a.ended_at is not None or ctx.alive is False):
            clean = clean_exit(a)
            state: vocab.WatchState = "exited" if clean else "dead"
            how = attempt_ended(a) if a.ended_at is not None else "process gone"
            reason = f"attempt {a.n} {how} (the state rule failed)"
            found = [] if clean else [Finding(code="DEAD", severity="critical", key="", message=reason)]
            return state, reason, found
        state, reason = self._last
        return state, f"{reason} (the state rule failed: last known)", []


def _unjudged(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.code not in JUDGED_CODES]


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
    stale = attempt is not None and procs.attempt not in (0, attempt)
    states = {} if stale else dict(procs.states)
    workers = [] if stale else list(procs.workers)
    # A worker in a session of its own (torchrun's) is the attempt's as much as its group is.
    states.update({w.pid: w.state for w in workers})
    return WatchContext(
        thresholds=th,
        alive=alive,
        attempt_pids=list(attempt_pids) or sorted(states),
        gpu=sample.gpu,
        host=sample.host,
        proc_states=states,
        workers=workers,
        activity={} if stale else dict(procs.activity),
        locks=list(procs.locks),
        duplicates=list(procs.duplicates),
        leftovers=list(procs.leftovers),
        log_crash=log_crash,
        probe_t=sample.t,
    )


# The keeper imports these from here: the watchdog's entry points and the rules it runs.
__all__ = [
    "STATES",
    "Memory",
    "Pause",
    "Verdict",
    "WatchContext",
    "Watchdog",
    "context_from_probe",
    "crash_from_log",
    "median_interval",
    "progress_bound",
    "repeat_death",
]
