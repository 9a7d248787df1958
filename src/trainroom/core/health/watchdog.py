"""The watchdog: the run's state (starting, running, slow, stalled, hung, dead, exited) and the
findings about life, progress, the GPU, host RAM, locks, duplicates and crash causes.

Every rule is a pure function of the run (`state.RunState`, the fold every client sees), the
latest probe results (`WatchContext`) and the clock `now`; each lives in the module named for
what it judges (life, progress, gpu, host, crash). What must outlive one call lives in a small
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

from collections.abc import Iterable

import msgspec

from trainroom.core import protocol as p
from trainroom.core.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.health.crash import attempt_masked_error, crash_from_log, repeat_death
from trainroom.core.health.gpu import (
    busy_devices,
    ghost_finding,
    ghost_measure,
    ghost_seen,
    orphan_candidates,
    orphan_findings,
)
from trainroom.core.health.host import duplicate_findings, host_ram_low_now, stale_locks
from trainroom.core.health.life import dead_finding, dying_verdict, ended_verdict, fatal_worker
from trainroom.core.health.progress import progress
from trainroom.core.run.figures import median_interval, progress_bound
from trainroom.core.run.state import RunState
from trainroom.core.samples import ProcsSample

STATES = ("starting", "running", "slow", "stalled", "hung", "dead", "exited")

# Findings whose figures move while the condition lasts (a growing gap, a ratio per sample). The
# keeper journals a finding again whenever its message changes, so their message keeps the
# figures of first detection while the cause and severity stay; the evidence stays live.
VOLATILE = frozenset({"STALLED", "HUNG", "SLOW", "GHOST_MEMORY", "HOST_RAM_LOW", "ORPHAN_CONTEXT"})


def _present(*found: Finding | None) -> list[Finding]:
    return [f for f in found if f is not None]


class Verdict(msgspec.Struct, kw_only=True):
    state: str
    reason: str
    findings: list[Finding] = []


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
            m.ghost_streak = m.ghost_streak + 1 if ghost_seen(ghost_measure(run, ctx), ctx) else 0
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
            state, reason, found = ended_verdict(run, a, ctx)
            findings += found
        elif ctx.alive is False:
            state, reason = "dead", f"attempt {a.n}: process gone, exit status not yet known"
            findings.append(dead_finding(run, a, ctx))
        elif (fatal := fatal_worker(run, a)) is not None:
            state, reason, found = dying_verdict(run, a, fatal, ctx)
            findings += found
        else:
            state, reason, found = progress(run, ctx, now, m)
            findings += found
        if a is not None:
            findings += [
                f for f in (repeat_death(run, ctx.thresholds), attempt_masked_error(run, ctx.log_crash)) if f
            ]
        findings += [f for f in (ghost_finding(ghost_measure(run, ctx), m.ghost_streak, run, ctx),) if f]
        findings += orphan_findings(run, ctx, m)
        findings += [f for f in (host_ram_low_now(run, ctx),) if f]
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
        log_crash=log_crash,
        probe_t=sample.t,
    )


# The keeper imports these from here: the watchdog's entry points and the rules it runs.
__all__ = [
    "STATES",
    "Memory",
    "Verdict",
    "WatchContext",
    "Watchdog",
    "context_from_probe",
    "crash_from_log",
    "median_interval",
    "progress_bound",
    "repeat_death",
]
