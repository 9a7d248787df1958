"""resume: a new attempt from the last verified checkpoint, once the death criteria hold (the
old group gone, no lock held, the driver's memory back, the RAM the load needs)."""

from __future__ import annotations

import time

from trainroom.core.actions.base import (
    Action,
    ActionSpec,
    Args,
    Call,
    Keeper,
    Outcome,
    Plan,
    Refused,
    live_attempt,
)
from trainroom.core.ops.resume import ResumePlan
from trainroom.core.run.state import RunState
from trainroom.core.units import fmt_bytes

# How long a resume waits for checkpoints still being verified (the newest may be among them).
RESUME_WAIT_S = 120.0


class ResumeArgs(Args, kw_only=True):
    pass


# Open findings under which the keeper refuses a resume (a lock held, GPU memory not released).
BLOCKING = frozenset({"ORPHAN_CONTEXT", "STALE_LOCK"})


def sick_gpu(state: RunState) -> str | None:
    """Why a resume would land on a GPU that cannot take it (lost: GPU_LOST; a page retirement
    or row remap waiting for a reset: GPU_ECC), naming the devices that are healthy; None: none."""
    sick: dict[int, str] = {}
    for f in state.open_findings():
        ev = f.evidence
        dev = ev.get("device")
        if not isinstance(dev, int):
            continue
        bus = f" ({ev['bus_id']})" if ev.get("bus_id") else ""
        if f.code == "GPU_LOST":
            sick.setdefault(dev, f"GPU {dev}{bus} is lost (GPU_LOST)")
        elif f.code == "GPU_ECC" and (
            ev.get("retired_pending") or ev.get("remap_pending") or ev.get("remap_failed")
        ):
            sick.setdefault(
                dev, f"GPU {dev}{bus} has a page retirement or row remap waiting for a reset (GPU_ECC)"
            )
    if not sick:
        return None
    gpu = state.probe.gpu if state.probe is not None else None
    healthy = [
        f"GPU {d.index}" + (f" ({d.pci_bus_id})" if d.pci_bus_id else "")
        for d in (gpu.devices if gpu is not None else [])
        if d.index not in sick and not d.lost
    ]
    where = (
        f"healthy: {', '.join(healthy)} (resume there: CUDA_VISIBLE_DEVICES, or another node)"
        if healthy
        else "no healthy GPU on this host: resume on another node"
    )
    return f"{'; '.join(sick[k] for k in sorted(sick))}: a resume here would start on it; {where}"


class Resume(Action[ResumeArgs, ResumePlan, ResumePlan]):
    spec = ActionSpec(
        name="resume",
        key="R",
        description="Resume from the last verified checkpoint as a new attempt",
        destructive=True,
        cancellable=True,
        when="the trainer is not running and a checkpoint verified",
        needs_keeper=False,
        question="Resume the run as a new attempt?",
    )
    Args = ResumeArgs
    Target = ResumePlan  # what a client shows is the ops plan itself

    def precondition(self, state: RunState, args: ResumeArgs) -> str | None:
        a = state.attempt
        if a is not None and live_attempt(state):
            return f"attempt {a.n} is still running: kill it first"
        return sick_gpu(state)

    def not_offered(self, state: RunState, args: ResumeArgs) -> str | None:
        # The keeper also finds a `latest` under the root that this run never saw; a client
        # offers a resume only from a checkpoint the run verified.
        if state.attempt is not None and not any(c.state == "verified" for c in state.checkpoints):
            return "no verified checkpoint to resume from: start it again from scratch (`trainroom launch`)"
        # What the keeper refuses a resume for while the old attempt's processes hold on (its
        # lock, its GPU memory): the fix is the kill those findings offer, not a resume.
        holding = sorted({f.code for f in state.findings.values() if f.code in BLOCKING})
        if holding:
            return f"the old attempt's processes still hold on ({', '.join(holding)}): kill them first"
        return None

    async def plan(self, k: Keeper, args: ResumeArgs, call: Call) -> Plan[ResumePlan, ResumePlan] | Refused:
        still = await k.wait_in_flight(RESUME_WAIT_S, call.say)
        plan = await k.resume_plan()
        if still:
            # Refused with what is still being verified: the newest resume point may be among them.
            waiting = ", ".join(f"{path} (for {time.time() - since:.0f} s)" for path, since in still)
            plan.refusals.append(f"still verifying {waiting}: resume again once it has a verdict")
            plan.ok = False
        if not plan.ok:
            return Refused("; ".join(plan.refusals), plan)
        note = f"; {plan.note}" if plan.note else ""
        lost = f"; not a faithful resume: {len(plan.lost)} part(s) lost or reset" if plan.lost else ""
        return Plan(
            f"resume attempt {plan.attempt} from {plan.checkpoint} (step {plan.step}){lost}{note}",
            plan,
            plan,
        )

    async def execute(
        self, k: Keeper, args: ResumeArgs, plan: Plan[ResumePlan, ResumePlan], call: Call
    ) -> Outcome:
        return await k.resume_start(plan.work, call.say)

    def identity(self, plan: ResumePlan) -> object:
        return (plan.checkpoint, plan.step, plan.digest, plan.argv)

    def headline(self, plan: ResumePlan, summary: str) -> str:
        lost, died = plan.steps_lost, plan.died_at_step
        again = (
            f"the {lost} step{'s' if lost != 1 else ''} after it, up to step {died}, are trained again"
            if lost is not None and lost > 0
            else "nothing is trained again"
        )
        faithful = f"; not a faithful resume: {len(plan.lost)} part(s) lost or reset" if plan.lost else ""
        return f"starts attempt {plan.attempt} from {plan.checkpoint} (step {plan.step}); {again}{faithful}"

    def plan_lines(self, plan: ResumePlan) -> list[str]:
        # What still stands in its way first (its fix before this one), then what the checkpoint
        # cannot give back, a line each: what a person weighs.
        return (
            [f"  in its way: {x}" for x in plan.in_the_way]
            + [f"  lost: {x}" for x in plan.lost]
            + resume_lines(plan)
        )


def resume_lines(plan: ResumePlan) -> list[str]:
    """A resume plan for a person: from what, with which command, what the checks found."""
    size = plan.checkpoint_bytes
    out = [
        f"  from {plan.checkpoint}, saved at step {plan.step}"
        + (f" ({fmt_bytes(size)})" if size is not None else "")
    ]
    if plan.restore_from:
        out.append(f"  restored first from its verified copy {plan.restore_from}")
    if plan.argv:
        how = f" (resume template from {plan.template_from})" if plan.template_from else ""
        out.append(f"  runs {' '.join(plan.argv)}{how}")
    if plan.died_at_step is not None:
        out.append(f"  the last attempt reached step {plan.died_at_step}")
    if plan.driver_bytes is not None:
        out.append(f"  the driver holds {fmt_bytes(plan.driver_bytes)} for the old attempt")
    if plan.mem_available_bytes is not None:
        need = plan.load_need_bytes
        out.append(
            f"  host memory available: {fmt_bytes(plan.mem_available_bytes)}"
            + (f"; the load needs {fmt_bytes(need)}" if need is not None else "")
        )
    if plan.note:
        out.append(f"  note: {plan.note}")
    out += [f"  refused: {why}" for why in plan.refusals]
    return out
