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

    def headline(self, plan: dict[str, Any], summary: str) -> str:
        cache = fmt_bytes(plan.get("page_cache_bytes"))
        if plan.get("method") == "drop_caches":
            return (
                f"drops the whole machine's page cache ({cache}), every process's: their files are "
                "read from disk again; no data is lost"
            )
        return (
            f"reclaims the page cache of cgroup {plan.get('cgroup')} ({cache} cached on the machine): "
            "its files are read from disk again; no data is lost"
        )

    def plan_lines(self, plan: dict[str, Any]) -> list[str]:
        cache = fmt_bytes(plan.get("page_cache_bytes"))
        if plan.get("method") == "drop_caches":
            what = (
                f"  drops the whole machine's page cache ({cache} now), every process's, not only "
                "this run's: files are read from disk again"
            )
        else:
            what = f"  reclaims the page cache of cgroup {plan.get('cgroup')} ({cache} on the machine now)"
        asked = plan.get("bytes_requested")
        size = f" ({fmt_bytes(asked)} to reclaim)" if isinstance(asked, int) else ""
        out = [what, f"  writes {plan.get('value')!s}{size} to {plan.get('target')}"]
        out += [f"  not used: {why}" for why in plan.get("passed_over") or []]
        if plan.get("wsl_note"):
            out.append(f"  {plan.get('wsl_note')}")
        return out

    def detail_lines(self, plan: dict[str, Any]) -> list[str]:
        return self.plan_lines(plan)[1:]  # the headline says whose page cache, and how much

    def target(self, plan: dict[str, Any]) -> object:
        return (plan.get("method"), plan.get("target"))
