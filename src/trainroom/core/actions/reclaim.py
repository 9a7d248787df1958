"""reclaim: the host's page cache, the way this host allows (cgroup memory.reclaim, else
drop_caches)."""

from __future__ import annotations

import asyncio

from trainroom.core.actions.base import Action, ActionSpec, Args, Call, Keeper, Outcome, Plan, Refused
from trainroom.core.ops.reclaim import ReclaimPlan, execute_reclaim, plan_reclaim
from trainroom.core.units import fmt_bytes


class ReclaimArgs(Args, kw_only=True):
    pass


class Reclaim(Action[ReclaimArgs, ReclaimPlan, ReclaimPlan]):
    spec = ActionSpec(
        name="reclaim",
        key="C",
        description="Reclaim the host page cache (cgroup memory.reclaim or drop_caches)",
        destructive=True,
        question="Reclaim the host page cache?",
    )
    Args = ReclaimArgs
    Target = ReclaimPlan  # what a client shows is the ops plan itself

    async def plan(
        self, k: Keeper, args: ReclaimArgs, call: Call
    ) -> Plan[ReclaimPlan, ReclaimPlan] | Refused:
        roots = k.run.settings.roots
        plan = await asyncio.to_thread(plan_reclaim, roots.cgroup, roots.proc)
        cache = plan.page_cache_bytes
        msg = f"reclaim page cache via {plan.method} ({plan.target})" + (
            f": {fmt_bytes(cache)} cached now" if cache is not None else ""
        )
        return Plan(msg, plan, plan)

    async def execute(
        self, k: Keeper, args: ReclaimArgs, plan: Plan[ReclaimPlan, ReclaimPlan], call: Call
    ) -> Outcome:
        roots = k.run.settings.roots
        result = await asyncio.to_thread(
            execute_reclaim, plan.work, sys_root=roots.cgroup, proc_root=roots.proc, progress=call.say
        )
        r = result.as_dict()
        return Outcome(result.ok, result.message, r.get("before", {}), r.get("after", {}))

    def headline(self, plan: ReclaimPlan, summary: str) -> str:
        cache = fmt_bytes(plan.page_cache_bytes)
        if plan.method == "drop_caches":
            return (
                f"drops the whole machine's page cache ({cache}), every process's: their files are "
                "read from disk again; no data is lost"
            )
        return (
            f"reclaims the page cache of cgroup {plan.cgroup} ({cache} cached on the machine): "
            "its files are read from disk again; no data is lost"
        )

    def plan_lines(self, plan: ReclaimPlan) -> list[str]:
        cache = fmt_bytes(plan.page_cache_bytes)
        if plan.method == "drop_caches":
            what = (
                f"  drops the whole machine's page cache ({cache} now), every process's, not only "
                "this run's: files are read from disk again"
            )
        else:
            what = f"  reclaims the page cache of cgroup {plan.cgroup} ({cache} on the machine now)"
        asked = plan.bytes_requested
        size = f" ({fmt_bytes(asked)} to reclaim)" if asked is not None else ""
        out = [what, f"  writes {plan.value}{size} to {plan.target}"]
        out += [f"  not used: {why}" for why in plan.passed_over]
        if plan.wsl_note:
            out.append(f"  {plan.wsl_note}")
        return out

    def detail_lines(self, plan: ReclaimPlan) -> list[str]:
        return self.plan_lines(plan)[1:]  # the headline says whose page cache, and how much

    def identity(self, plan: ReclaimPlan) -> object:
        return (plan.method, plan.target)
