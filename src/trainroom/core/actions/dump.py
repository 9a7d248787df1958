"""dump: the trainer's Python stacks (faulthandler through SIGUSR1 when instrumented, else
py-spy, a dependency of the default install), and with `rank` a job's rank (its NCCL flight
recorder too). On a torchrun run the stacks are the workers' (the processes carrying RANK), one
block per rank, not the launcher's: the launcher only waits on them. A stopped process is said
to be stopped (its stacks are where it stopped; `continue` lets it run), never a failure."""

from __future__ import annotations

import asyncio
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
    Refused,
    arg,
    as_builtins,
    live_attempt,
    not_running,
)
from trainroom.core.configuration import argtypes
from trainroom.core.ops import flight
from trainroom.core.ops.stacks import DumpTarget, dump_stacks, dump_targets
from trainroom.core.run.state import RunState


class DumpArgs(Args, kw_only=True):
    rank: Annotated[
        int | None,
        arg(
            "a job's rank whose reporter is connected (its NCCL flight recorder too); "
            "default: the trainer, each rank on torchrun",
            parse=argtypes.count(0, 1 << 20),
        ),
    ] = None


class RankPid(msgspec.Struct, kw_only=True):
    rank: int
    pid: int


class DumpShown(msgspec.Struct, kw_only=True):
    """A dump's plan as shown: whose stacks (a pid, or each rank's), read how."""

    pid: int
    method: str = ""
    ranks: list[RankPid] = []


@dataclass(frozen=True)
class DumpWork:
    pid: int
    instrumented: bool
    ranks: tuple[DumpTarget, ...] = ()  # a torchrun run's workers: each dumped, labelled by rank


class Dump(Action[DumpArgs, DumpWork, DumpShown]):
    spec = ActionSpec(
        name="dump",
        key="d",
        description="Dump the trainer's stacks, each rank's on torchrun (faulthandler, else py-spy)",
        destructive=False,
        cancellable=True,
        when="the trainer runs",
    )
    Args = DumpArgs
    Target = DumpShown

    def precondition(self, state: RunState, args: DumpArgs) -> str | None:
        a = state.attempt
        if a is None or a.pid <= 0 or not live_attempt(state):
            return not_running(state)
        if args.rank is not None:
            r = state.ranks.get(args.rank)
            if r is None or r.attempt != a.n or r.pid is None or not r.connected:
                return f"rank {args.rank} has no connected reporter in attempt {a.n}"
        return None

    async def plan(self, k: Keeper, args: DumpArgs, call: Call) -> Plan[DumpWork, DumpShown] | Refused:
        st = k.run.state
        a = st.attempt
        assert a is not None
        stopped = st.status == "hung" and "stopped" in st.status_reason
        if args.rank is not None:
            # The rank asked for: its reporter proved the pid by SO_PEERCRED at hello.
            r = st.ranks[args.rank]
            assert r.pid is not None
            return _planned(r.pid, True, f"rank {args.rank} (pid {r.pid})", stopped)
        ranks = rank_targets(st)
        if ranks:
            # A torchrun run: every worker, the one a HUNG names first (the launcher only waits).
            hung = st.hung_worker()
            ranks.sort(key=lambda t: (t.pid != hung, t.rank))
            who = ", ".join(f"rank {t.rank} (pid {t.pid})" for t in sorted(ranks, key=lambda t: t.rank))
            plan = _planned(ranks[0].pid, ranks[0].instrumented, f"{len(ranks)} ranks: {who}", stopped)
            plan.target.ranks = [RankPid(rank=t.rank, pid=t.pid) for t in ranks]
            plan.work = DumpWork(ranks[0].pid, ranks[0].instrumented, tuple(ranks))
            return plan
        return _planned(a.pid, a.instrumented, f"pid {a.pid}", stopped)

    async def execute(
        self, k: Keeper, args: DumpArgs, plan: Plan[DumpWork, DumpShown], call: Call
    ) -> Outcome:
        work = plan.work
        log = str(k.run.log_path)
        if work.ranks:
            got = await asyncio.to_thread(dump_targets, list(work.ranks), log, call.say)
            ok = any(d.ok for _, d in got)
            blocks = [
                {
                    "rank": t.rank,
                    "pid": t.pid,
                    "method": d.method,
                    "message": d.message,
                    "stacks": d.text,
                    "stopped": d.stopped,
                }
                for t, d in got
            ]
            read = sum(1 for _, d in got if d.text)
            methods = sorted({str(d.method) for _, d in got if d.method})
            message = f"stacks of {read} of {len(got)} ranks" + (
                f", read by {' and '.join(methods)}" if methods else ""
            )
            said = [f"rank {t.rank}: {d.message}" for t, d in got if not d.text or "stopped" in d.message]
            if said:
                message += "; " + "; ".join(said)
            after: dict[str, Any] = {"method": "/".join(methods) or None, "ranks": blocks}
            return Outcome(ok, message, after=after)  # the planned target: each rank and its pid
        out = await asyncio.to_thread(dump_stacks, work.pid, log, work.instrumented)
        after = {"method": out.method, "stacks": out.text, "stopped": out.stopped}
        if args.rank is not None:
            after["flight_recorder"] = as_builtins(
                await asyncio.to_thread(flight.trigger, work.pid, args.rank)
            )
        return Outcome(out.ok, out.message, after=after, target=DumpShown(pid=work.pid))

    def identity(self, plan: DumpShown) -> object:
        return (plan.pid, sorted(r.pid for r in plan.ranks))

    def plan_lines(self, plan: DumpShown) -> list[str]:
        if plan.ranks:
            return [f"  rank {r.rank}: pid {r.pid}" for r in plan.ranks] + [f"  by {plan.method}"]
        return [f"  pid {plan.pid}, by {plan.method}"]


def rank_targets(st: RunState) -> list[DumpTarget]:
    """The live attempt's workers (a torchrun run's ranks), each with whether its reporter is
    connected from that very pid (then faulthandler answers; else py-spy reads it)."""
    a = st.attempt
    if a is None:
        return []
    out = []
    for w in st.workers.values():
        if w.attempt != a.n or not w.alive:
            continue
        r = st.ranks.get(w.rank)
        reporting = r is not None and r.attempt == a.n and r.pid == w.pid and r.connected
        out.append(DumpTarget(rank=w.rank, pid=w.pid, instrumented=reporting))
    return out


def _planned(pid: int, instrumented: bool, who: str, stopped: bool) -> Plan[DumpWork, DumpShown]:
    how = (
        "py-spy (stopped: read without pausing)"
        if stopped
        else "SIGUSR1 (faulthandler)"
        if instrumented
        else "py-spy (uninstrumented)"
    )
    return Plan(
        f"dump stacks of {who} via {how}", DumpShown(pid=pid, method=how), DumpWork(pid, instrumented)
    )
