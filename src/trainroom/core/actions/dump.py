"""dump: one process's Python stacks (faulthandler through SIGUSR1 when instrumented, else
py-spy), and with `rank` a job's rank (its NCCL flight recorder too)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from trainroom.core.actions.base import (
    Action,
    ActionSpec,
    Args,
    Call,
    Keeper,
    Outcome,
    Plan,
    Refused,
    as_builtins,
    live_attempt,
    not_running,
)
from trainroom.core.ops import flight
from trainroom.core.ops.stacks import dump_stacks
from trainroom.core.run.state import RunState


class DumpArgs(Args, kw_only=True):
    rank: int | None = None  # a job's rank whose reporter is connected; else the trainer (or the HUNG rank)


@dataclass(frozen=True)
class DumpWork:
    pid: int
    instrumented: bool


class Dump(Action[DumpArgs, DumpWork]):
    spec = ActionSpec(
        name="dump",
        key="d",
        description="Dump the trainer's stacks (faulthandler, or py-spy when uninstrumented)",
        destructive=False,
        cancellable=True,
        when="the trainer runs",
    )
    Args = DumpArgs

    def precondition(self, state: RunState, args: DumpArgs) -> str | None:
        a = state.attempt
        if a is None or a.pid <= 0 or not live_attempt(state):
            return not_running(state)
        if args.rank is not None:
            r = state.ranks.get(args.rank)
            if r is None or r.attempt != a.n or r.pid is None or not r.connected:
                return f"rank {args.rank} has no connected reporter in attempt {a.n}"
        return None

    async def plan(self, k: Keeper, args: DumpArgs, call: Call) -> Plan[DumpWork] | Refused:
        st = k.run.state
        a = st.attempt
        assert a is not None
        # One rank's process: the rank asked for (its reporter proved the pid by SO_PEERCRED at
        # hello, while connected), else the rank a HUNG names (a torchrun worker), else the
        # attempt's own process.
        pid, instrumented, who = a.pid, a.instrumented, f"pid {a.pid}"
        if (hung := st.hung_worker()) is not None:
            pid, who = hung, f"pid {hung}"
        if args.rank is not None:
            r = st.ranks[args.rank]
            assert r.pid is not None
            pid, instrumented, who = r.pid, True, f"rank {args.rank} (pid {r.pid})"
        stopped = st.status == "hung" and "stopped" in st.status_reason
        how = (
            "py-spy (stopped: read without pausing)"
            if stopped or not instrumented
            else "SIGUSR1 (faulthandler)"
        )
        return Plan(
            f"dump stacks of {who} via {how}", {"pid": pid, "method": how}, DumpWork(pid, instrumented)
        )

    async def execute(self, k: Keeper, args: DumpArgs, plan: Plan[DumpWork], call: Call) -> Outcome:
        pid = plan.work.pid
        out = await asyncio.to_thread(dump_stacks, pid, str(k.run.log_path), plan.work.instrumented)
        after: dict[str, Any] = {"method": out.method, "stacks": out.text}
        if args.rank is not None:
            after["flight_recorder"] = as_builtins(await asyncio.to_thread(flight.trigger, pid, args.rank))
        return Outcome(out.ok, out.message, after=after, target={"pid": pid})

    def target(self, plan: dict[str, Any]) -> object:
        return plan.get("pid")
