"""kill: the trainer's process group (SIGTERM, grace, SIGKILL), or with `finding` what that open
finding targets (a duplicate trainer, a lock holder, leftovers); then confirm the VRAM fell. With
`pid` and `signal`: one process of the run, the chosen signal only (the processes table's kill,
ops/signal_one.py), proven by its pid, start tick and membership in the live attempt."""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from trainroom.core.actions.base import (
    Action,
    ActionSpec,
    Args,
    Call,
    Keeper,
    Outcome,
    Plan,
    Proc,
    Refused,
    arg,
    live_attempt,
    not_running,
    procs,
)
from trainroom.core.configuration import argtypes
from trainroom.core.findings import Finding
from trainroom.core.logs.loglines import NOT_STEPS, step_words
from trainroom.core.ops.kill import KILL_CONFIRM_S, KillPlan, execute_kill, plan_kill
from trainroom.core.ops.members import Lifetime
from trainroom.core.ops.signal_one import ENDS, SIGNALS, SignalPlan, execute_signal, plan_signal, signal_name
from trainroom.core.ops.target_kill import plan_target_kill
from trainroom.core.ops.vram import run_vram_probe
from trainroom.core.run.parts import AttemptView
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

# After a kill's grace and confirmation, how long its target's end still counts as "stopped".
STOP_MARGIN_S = 10.0


def _signal_arg(text: str) -> str:
    """`--signal`: a name of SIGNALS (any case, SIG or not); argparse says a bad one and exits 2."""
    name = signal_name(text)
    if name is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(SIGNALS)}")
    return name


class KillArgs(Args, kw_only=True):
    # seconds between SIGTERM and SIGKILL ([kill] grace_s when None)
    grace_s: Annotated[
        float | None,
        arg(
            "seconds between SIGTERM and SIGKILL (default: [kill] grace_s, else 10)",
            flag="--grace",
            parse=argtypes.seconds(0, 3600),
        ),
    ] = None
    finding: Annotated[
        str | None,
        arg(
            "kill what this open finding targets (its ident in `status --json`, e.g. "
            "DUPLICATE_TRAINER:trainer), not the trainer",
            metavar="IDENT",
        ),
    ] = None
    pid: Annotated[
        int | None,
        arg(
            "signal only this process of the run (its pid in the control room's processes table)",
            parse=argtypes.count(2, 4_194_304),
        ),
    ] = None
    # ... which started at this tick (the row a person chose in the processes table)
    start_ticks: Annotated[int | None, arg("the start tick of --pid's process", cli=False)] = None
    signal: Annotated[
        str | None,
        arg(
            f"with --pid: the signal to send, one of {', '.join(SIGNALS)} (default TERM)",
            metavar="NAME",
            parse=_signal_arg,
        ),
    ] = None


class LeftAlone(msgspec.Struct, kw_only=True):
    """A process found beside the target that is not proven the run's: never signalled."""

    pid: int
    cmdline: list[str] = []
    why: str = ""


class KillTarget(msgspec.Struct, kw_only=True):
    """A kill's plan as shown and confirmed: the process group (pgid 0: a finding's target or
    one process, named by `label`) and its members, what is left alone, the timing, and what the
    kill loses."""

    pgid: int = 0
    leader_pid: int = 0
    leader_start_time: float = 0.0
    leader_start_ticks: int | None = None
    run_id: str = ""
    attempt_ended_at: float | None = None
    attached: bool = False
    members: list[Proc] = []
    strangers: list[LeftAlone] = []
    refusals: list[str] = []
    empty: bool = False
    label: str = ""
    ok: bool = True
    nothing_left: bool = False
    signal: str | None = None  # one process, this signal only (the processes table's kill)
    finding: str | None = None  # a finding's target, not the trainer
    grace_s: float | None = None
    vram_timeout_s: float | None = None
    # Why the GPU memory is not waited for (the last probe had no driver view): said in the plan.
    vram_unseen: str | None = None
    step: int | None = None  # the attempt's last step: what the kill stops at
    last_verified_step: int | None = None
    step_unit: str | None = None  # the log counts batches or dicts, not steps

    @property
    def who(self) -> str:
        return self.label or f"process group {self.pgid}"


@dataclass
class KillWork:
    plan: KillPlan
    vram_pids: list[int]
    stopping: AttemptView | None
    one: SignalPlan | None = None  # one process's signal, in place of the kill
    vram_of: str = ""  # whose rows the VRAM wait reads, when not the run's (a finding's target)


class Kill(Action[KillArgs, KillWork, KillTarget]):
    spec = ActionSpec(
        name="kill",
        key="ctrl+k",
        description="Kill the trainer's process group (SIGTERM, then SIGKILL) and confirm VRAM fell",
        destructive=True,
        # A cancel ends the wait for the VRAM, never the signalling (see `execute`).
        cancellable=True,
        when="the trainer runs (a finding's kill: the finding is open)",
        question="Kill the trainer's process group?",
        cancel_ends="the wait",
    )
    Args = KillArgs
    Target = KillTarget

    def validate(self, args: KillArgs) -> str | None:
        if args.grace_s is not None and argtypes.checked(args.grace_s, 0, 3600) is None:
            return f"grace_s must be seconds in [0, 3600], got {args.grace_s!r}"
        if args.signal is not None and signal_name(args.signal) is None:
            return f"signal must be one of {', '.join(SIGNALS)}, got {args.signal!r}"
        if args.pid is None and (args.signal is not None or args.start_ticks is not None):
            return "a signal or a start tick names one process: give its pid too"
        if args.pid is not None and args.pid <= 1:
            return f"pid must be a process of the run (> 1), got {args.pid}"
        if args.pid is not None and args.finding is not None:
            return "give a finding or a pid, not both"
        return None

    def precondition(self, state: RunState, args: KillArgs) -> str | None:
        if args.pid is not None:
            return None if live_attempt(state) else not_running(state)
        if args.finding is not None:
            f = state.findings.get(args.finding)
            if f is None:
                return f"finding {args.finding!r} is not open (it cleared, or never was)"
            if f.action != "kill":
                return f"finding {f.ident} offers no kill (its action: {f.action or 'none'})"
            if f.target is not None:
                return None
        a = state.attempt
        if a is None:
            return not_running(state)
        if a.pid <= 0:
            return "this run has no attempt with a process group to kill"
        # An ended attempt may still have members (orphans of a dead leader), and with none left
        # the kill still confirms the driver released their memory: the plan says which.
        return None

    def not_offered(self, state: RunState, args: KillArgs) -> str | None:
        f = state.findings.get(args.finding) if args.finding is not None else None
        if f is not None and f.target is not None and f.target.pids:
            return None
        return None if live_attempt(state) else not_running(state)

    async def plan(self, k: Keeper, args: KillArgs, call: Call) -> Plan[KillWork, KillTarget] | Refused:
        st = k.run.state
        if args.pid is not None:
            return await self._plan_one(k, args)
        f = st.findings.get(args.finding) if args.finding is not None else None
        if f is not None and f.target is not None:
            return await self._plan_target(k, f, args)
        a = st.attempt
        assert a is not None
        plan = await asyncio.to_thread(
            plan_kill,
            a.pid,
            a.pgid,
            a.start_time,
            attempt_start_ticks=a.start_ticks,
            keeper_pid=os.getpid(),
            run_id=k.run.run_id,
            attempt_ended_at=a.ended_at,
            workers=st.attempt_workers(),
            attached=a.attached,
        )
        pids = [m.pid for m in plan.members]
        if plan.nothing_left:
            # The attempt died whole (a SIGKILL): nothing to signal, but a kill still confirms
            # the driver gave its memory back before anyone resumes.
            summary = (
                f"nothing left to kill of attempt {a.n}: process group {plan.pgid} has no live members; "
                "confirm the driver released its memory"
            )
        else:
            summary = (
                f"kill process group {plan.pgid} of attempt {a.n}: {len(pids)} process(es), "
                f"pids {', '.join(map(str, pids))}"
            )
        last = st.last_verified()
        lost: dict[str, Any] = {
            "step": a.last_step,
            "last_verified_step": last.step if last is not None else None,
        }
        if not a.instrumented and st.log_unit in NOT_STEPS:  # the log counts batches or dicts
            lost["step_unit"] = st.log_unit
        return self._planned(plan, summary, sorted({a.pid, *pids}), a, _timing(k, args) | lost)

    async def _plan_target(
        self, k: Keeper, f: Finding, args: KillArgs
    ) -> Plan[KillWork, KillTarget] | Refused:
        assert f.target is not None
        plan = await asyncio.to_thread(
            plan_target_kill,
            f.target,
            keeper_pid=os.getpid(),
            run_id=k.run.run_id,
            live_trainer=_live_trainer(k.run.state),
        )
        pids = [m.pid for m in plan.members]
        if plan.nothing_left:
            summary = (
                f"nothing left to kill of {plan.subject} ({f.ident}); confirm the driver released its memory"
            )
        else:
            summary = (
                f"kill {plan.subject} ({f.ident}): {len(pids)} process(es), pids {', '.join(map(str, pids))}"
            )
        extra = _timing(k, args) | {"finding": f.ident}
        vram_pids = sorted(set(pids) | set(f.target.pids))
        of = f"pid{'s' if len(vram_pids) > 1 else ''} {', '.join(map(str, vram_pids))}"
        return self._planned(plan, summary, vram_pids, None, extra, of)

    async def _plan_one(self, k: Keeper, args: KillArgs) -> Plan[KillWork, KillTarget] | Refused:
        st = k.run.state
        a = st.attempt
        assert a is not None and args.pid is not None
        sig = signal_name(args.signal or "TERM") or "TERM"
        life = Lifetime(run_id=k.run.run_id, start_time=a.start_time, start_ticks=a.start_ticks)
        one = await asyncio.to_thread(
            plan_signal,
            args.pid,
            sig,
            start_ticks=args.start_ticks,
            life=life,
            keeper_pid=os.getpid(),
            label=process_label(st, args.pid),
        )
        target = KillTarget(
            signal=one.signal,
            label=one.label,
            members=procs([one.member] if one.member is not None else []),
            refusals=list(one.refusals),
            ok=one.ok,
        )
        if not one.ok:
            return Refused("; ".join(one.refusals), target)
        # The trainer's own end, caused by this signal, is "stopped", not a death (see `execute`).
        ends_leader = args.pid == a.pid and sig in ENDS
        work = KillWork(
            KillPlan(pgid=0, leader_pid=0, leader_start_time=0.0), [], a if ends_leader else None, one
        )
        return Plan(f"send SIG{sig} to {one.label}", target, work)

    @staticmethod
    def _planned(
        plan: KillPlan,
        summary: str,
        vram_pids: list[int],
        stopping: AttemptView | None,
        extra: dict[str, Any],
        vram_of: str = "",
    ) -> Plan[KillWork, KillTarget] | Refused:
        target = msgspec.convert(plan.as_dict() | extra, KillTarget)
        if not plan.ok and not plan.nothing_left:
            return Refused("; ".join(plan.refusals), target)
        return Plan(summary, target, KillWork(plan, vram_pids, stopping, vram_of=vram_of))

    async def execute(
        self, k: Keeper, args: KillArgs, plan: Plan[KillWork, KillTarget], call: Call
    ) -> Outcome:
        cfg = k.run.settings.kill
        grace = float(args.grace_s if args.grace_s is not None else cfg.grace_s)
        work = plan.work
        stopping = work.stopping
        if work.one is not None:
            if stopping is not None and stopping.alive:
                now = time.time()
                k.recorder.emit(
                    p.AttemptStopping(n=stopping.n, t=now, by=call.client, until=now + STOP_MARGIN_S)
                )
                k.recorder.flush(fsync=True)
            ok, message, before, after = await asyncio.to_thread(execute_signal, work.one)
            return Outcome(ok, message, before, after)
        if stopping is not None and stopping.alive and work.plan.members:
            # Journaled before the first signal: the end this causes is "stopped", not a death.
            now = time.time()
            until = now + grace + KILL_CONFIRM_S + STOP_MARGIN_S
            k.recorder.emit(p.AttemptStopping(n=stopping.n, t=now, by=call.client, until=until))
            k.recorder.flush(fsync=True)
        stop = threading.Event()
        running = asyncio.ensure_future(
            asyncio.to_thread(
                execute_kill,
                work.plan,
                grace_s=grace,
                vram_probe=run_vram_probe(
                    k.gpu,
                    work.vram_pids,
                    floor=stopping.vram_floor if stopping is not None else None,
                    of=work.vram_of,
                ),
                tolerance_bytes=cfg.vram_tolerance_bytes,
                vram_timeout_s=cfg.vram_timeout_s,
                progress=call.say,
                vram_poll_s=cfg.vram_poll_s,
                stop=stop,
            )
        )
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            # A client's cancel: the signals already sent are carried through (a group left
            # half-signalled helps nobody); only the wait for the driver ends, and the result
            # says what is known then.
            stop.set()
            call.say("cancel: ending the wait for VRAM once the signalling is done")
            result = await running
        r = result.as_dict()
        return Outcome(result.ok, result.message, r.get("before", {}), r.get("after", {}))

    def headline(self, plan: KillTarget, summary: str) -> str:
        return kill_headline(plan)

    def plan_lines(self, plan: KillTarget) -> list[str]:
        return kill_lines(plan)

    def detail_lines(self, plan: KillTarget) -> list[str]:
        return kill_lines(plan, lost=False)  # the headline says the steps lost

    def identity(self, plan: KillTarget) -> object:
        members = sorted((m.pid, m.start_ticks) for m in plan.members)
        if plan.signal:  # one process, one signal: both are what was confirmed
            return ("signal", plan.signal, members)
        return (plan.pgid, members)

    def narrowed(self, confirmed: object, now: object) -> bool:
        # Processes that ended on their own (a job's other node killed first, a rank exited):
        # signalling the rest acts on nothing unconfirmed. A process added, or a pid with another
        # start tick, is a change.
        if isinstance(confirmed, tuple) and isinstance(now, tuple) and len(confirmed) == len(now) == 2:
            return bool(confirmed[0] == now[0] and set(now[1]) <= set(confirmed[1]))
        return False

    def what_changed(self, confirmed: object, now: object) -> str:
        if isinstance(confirmed, tuple) and isinstance(now, tuple) and len(confirmed) == len(now) == 2:
            was = [pid for pid, _ in confirmed[1]]
            is_ = [pid for pid, _ in now[1]]
            return f"confirmed pids {was} of pgid {confirmed[0]}, now {is_} of pgid {now[0]}"
        return super().what_changed(confirmed, now)


def _timing(k: Keeper, args: KillArgs) -> dict[str, Any]:
    cfg = k.run.settings.kill
    grace = float(args.grace_s if args.grace_s is not None else cfg.grace_s)
    probe = k.run.state.probe
    gpu = probe.gpu if probe is not None else None
    if gpu is not None and not gpu.available:  # nothing to wait on: the wait returns at once
        return {"grace_s": grace, "vram_unseen": gpu.reason or "driver view unavailable"}
    return {"grace_s": grace, "vram_timeout_s": float(cfg.vram_timeout_s)}


def kill_headline(plan: KillTarget) -> str:
    """A kill plan in one line: what is signalled, how, and what is lost."""
    who = plan.who
    if plan.signal:
        what = SIGNAL_WORDS.get(plan.signal, "")
        return f"sends SIG{plan.signal} to {who} only{what}; every other process of the run is left alone"
    if not plan.members:
        return f"nothing of {who} is left to kill: only checks the GPU memory was released; nothing is lost"
    grace = plan.grace_s
    how = f"SIGTERM, then SIGKILL after {grace:g} s" if grace is not None else "SIGTERM, then SIGKILL"
    n = f"{len(plan.members)} process{'es' if len(plan.members) != 1 else ''}"
    if plan.finding:
        return f"kills {who} ({n}, {how}), what {plan.finding} names; the trainer is left alone"
    return f"kills {who} ({n}, {how}); {_lost(plan.step, plan.last_verified_step, plan.step_unit)}"


def _lost(step: int | None, last: int | None, unit: str | None = None) -> str:
    if step is None:
        return "the steps since the last verified checkpoint are lost"
    if unit is not None:  # the log counts batches or logged dicts: no subtraction holds
        return f"stops at {step_words(step, unit)}: the steps lost since the last verified checkpoint are not known"
    if last is not None:
        n = max(step - last, 0)
        return (
            f"loses {n} step{'s' if n != 1 else ''} (at step {step}, last verified checkpoint at step {last})"
        )
    return f"loses all {step} steps: no verified checkpoint yet"


def kill_lines(plan: KillTarget, *, lost: bool = True) -> list[str]:
    """A kill plan for a person: the signals and their timing, what is lost (unless `lost` is
    False: said elsewhere), then each process."""
    members, grace, wait, who = plan.members, plan.grace_s, plan.vram_timeout_s, plan.who
    out: list[str] = []
    if plan.signal:
        out.append(f"  SIG{plan.signal} to {who}, once; no SIGKILL follows")
    elif members:
        out.append(
            f"  SIGTERM to {who} ({len(members)} process(es)), "
            + (f"SIGKILL to any left after {grace:g} s" if grace is not None else "then SIGKILL")
        )
    else:
        out.append(f"  nothing of {who} is left to signal")
    if wait is not None:
        out.append(f"  then waits up to {wait:g} s for the GPU memory to be released")
    elif plan.vram_unseen and members and not plan.signal:
        out.append(f"  the GPU memory's release is not waited for ({plan.vram_unseen})")
    step, last, unit = plan.step, plan.last_verified_step, plan.step_unit
    if step is not None and members and lost:
        if unit is not None:  # no subtraction from a checkpoint's step holds
            ck = f"last verified checkpoint at step {last}" if last is not None else "no verified checkpoint"
            out.append(f"  stops at {step_words(step, unit)}; {ck}: the steps lost are not known")
        elif last is not None:
            out.append(
                f"  loses {max(step - last, 0)} step(s): at step {step}, last verified checkpoint at step {last}"
            )
        else:
            out.append(
                f"  loses all {step} step(s): no verified checkpoint yet (a resume starts from scratch)"
            )
    out += [f"    pid {m.pid}  {' '.join(m.cmdline)[:100]}" for m in members]
    out += [f"  left alone: pid {x.pid} ({x.why})" for x in plan.strangers]
    out += [f"  refused: {why}" for why in plan.refusals if not plan.nothing_left]
    return out


SIGNAL_WORDS = {
    "TERM": " (it should end; an ending rank may end the attempt)",
    "INT": " (as ^C would: it should end)",
    "KILL": " (it ends at once, without a chance to save)",
    "USR1": " (what it does with it is the program's: often a stack dump)",
    "STOP": " (it stops until a CONT: its peers will wait on it)",
    "CONT": " (a stopped process runs again)",
}


def process_label(st: RunState, pid: int) -> str:
    """`pid 4242 (rank 1)` / `(the agent)` where the probe's table knows it."""
    procs = st.probe.procs if st.probe is not None else None
    row = next((r for r in (procs.table if procs is not None else []) if r.pid == pid), None)
    if row is None:
        return f"pid {pid}"
    if row.role == "rank":
        return f"pid {pid} (rank {row.rank})"
    if row.role == "agent":
        return f"pid {pid} (the trainer's leader)"
    return (
        f"pid {pid} (a child of rank {row.rank})" if row.rank is not None else f"pid {pid} (a child process)"
    )


def _live_trainer(st: RunState) -> set[int]:
    """The live attempt's trainer processes, never a targeted kill's target: its leader, its
    ranks' reporters and its rank workers. Another member of its group (a DataLoader worker or an
    async-save child holding a CUDA context of its own) can be a finding's target."""
    a = st.attempt
    if a is None or not a.alive:
        return set()
    procs = st.probe.procs if st.probe is not None else None
    ranks = {r.pid for r in st.ranks.values() if r.pid}
    return {a.pid, *ranks, *(w.pid for w in (procs.workers if procs is not None else []))}
