"""continue: SIGCONT to the trainer's stopped processes, each proven the run's."""

from __future__ import annotations

import asyncio

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
    as_builtins,
    live_attempt,
    not_running,
    procs,
)
from trainroom.core.ops.members import Lifetime
from trainroom.core.ops.wake import WakePlan, execute_wake, plan_wake
from trainroom.core.run.state import RunState


class ContinueArgs(Args, kw_only=True):
    pass


class WakeShown(msgspec.Struct, kw_only=True):
    """A continue's plan as shown and confirmed: the stopped processes, each by pid and start tick."""

    pgid: int = 0
    members: list[Proc] = []


class Continue(Action[ContinueArgs, WakePlan, WakeShown]):
    spec = ActionSpec(
        name="continue",
        key="U",
        description="Continue the trainer's stopped processes (SIGCONT), proven the run's",
        destructive=True,
        when="the trainer runs and is hung",
        question="Continue the trainer's stopped processes?",
    )
    Args = ContinueArgs
    Target = WakeShown

    def precondition(self, state: RunState, args: ContinueArgs) -> str | None:
        a = state.attempt
        if a is None or a.pid <= 0 or not live_attempt(state):
            return not_running(state)
        if state.status != "hung":
            return f"nothing is stopped: the run is {state.status}"
        return None

    async def plan(self, k: Keeper, args: ContinueArgs, call: Call) -> Plan[WakePlan, WakeShown] | Refused:
        a = k.run.state.attempt
        assert a is not None
        life = Lifetime(
            run_id=k.run.run_id, start_time=a.start_time, start_ticks=a.start_ticks, attached=a.attached
        )
        plan = await asyncio.to_thread(plan_wake, a.pgid, life, k.run.state.attempt_workers())
        target = WakeShown(pgid=plan.pgid, members=procs(plan.stopped))
        if not plan.ok:
            return Refused("; ".join(plan.refusals), target)
        pids = [m.pid for m in plan.stopped]
        return Plan(f"SIGCONT {len(pids)} stopped process(es) of attempt {a.n}: {pids}", target, plan)

    async def execute(
        self, k: Keeper, args: ContinueArgs, plan: Plan[WakePlan, WakeShown], call: Call
    ) -> Outcome:
        result = await asyncio.to_thread(execute_wake, plan.work)
        return Outcome(result.ok, result.message, after=as_builtins(result))

    def headline(self, plan: WakeShown, summary: str) -> str:
        n = len(plan.members)
        return (
            f"sends SIGCONT to {n} stopped process{'es' if n != 1 else ''} of the trainer: they run on "
            "from where they stopped; nothing is lost"
        )

    def plan_lines(self, plan: WakeShown) -> list[str]:
        return [f"    pid {m.pid}  {' '.join(m.cmdline)[:100]}" for m in plan.members]

    def identity(self, plan: WakeShown) -> object:
        return sorted((m.pid, m.start_ticks) for m in plan.members)

    def narrowed(self, confirmed: object, now: object) -> bool:
        # Stopped processes that ended since: continuing the rest acts on nothing unconfirmed.
        if isinstance(confirmed, list) and isinstance(now, list):
            return set(now) <= set(confirmed)
        return False
