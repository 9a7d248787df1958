"""reclaim: the host's page cache, the way this host allows (cgroup memory.reclaim, else
drop_caches)."""

from __future__ import annotations

import asyncio
from typing import Any

from trainroom.core.actions.base import Action, ActionSpec, Args, Call, Keeper, Outcome, Plan, Refused
from trainroom.core.ops.reclaim import ReclaimPlan, execute_reclaim, plan_reclaim
from trainroom.core.units import fmt_bytes


class ReclaimArgs(Args, kw_only=True):
    pass


class Reclaim(Action[ReclaimArgs, ReclaimPlan]):
    spec = ActionSpec(
        name="reclaim",
        key="C",
        description="Reclaim the host page cache (cgroup memory.reclaim or drop_caches)",
        destructive=True,
    )
    Args = ReclaimArgs

    async def plan(self, k: Keeper, args: ReclaimArgs, call: Call) -> Plan[ReclaimPlan] | Refused:
        roots = k.run.settings.roots
        plan = await asyncio.to_thread(plan_reclaim, roots.cgroup, roots.proc)
        target = plan.as_dict()
        cache = target.get("page_cache_bytes")
        msg = f"reclaim page cache via {plan.method} ({plan.target})" + (
            f": {fmt_bytes(cache)} cached now" if isinstance(cache, int) else ""
        )
        return Plan(msg, target, plan)

    async def execute(self, k: Keeper, args: ReclaimArgs, plan: Plan[ReclaimPlan], call: Call) -> Outcome:
        roots = k.run.settings.roots
        result = await asyncio.to_thread(
            execute_reclaim, plan.work, sys_root=roots.cgroup, proc_root=roots.proc, progress=call.say
        )
        r = result.as_dict()
        return Outcome(result.ok, result.message, r.get("before", {}), r.get("after", {}))

    def target(self, plan: dict[str, Any]) -> object:
        return (plan.get("method"), plan.get("target"))
