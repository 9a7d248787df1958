"""prune: delete checkpoints beyond the last `keep` verified ones (never pinned, `latest`, one
being verified or the one the live attempt resumed from)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from trainroom.core.actions import words
from trainroom.core.actions.base import Action, ActionSpec, Args, Call, Keeper, Outcome, Plan, Refused, arg
from trainroom.core.configuration import argtypes
from trainroom.core.ops import prune as pruning
from trainroom.core.run.state import RunState
from trainroom.core.units import fmt_bytes
from trainroom.core.wire import protocol as p


class PruneArgs(Args, kw_only=True):
    keep: Annotated[
        int | None,
        arg("verified checkpoints kept (default: [checkpoints] keep)", parse=argtypes.count(0, 1_000_000)),
    ] = None
    include_rejected: Annotated[bool, arg("delete rejected checkpoints too")] = False
    dry_run: Annotated[bool, arg("only say what would be deleted")] = False


class Doomed(msgspec.Struct, kw_only=True):
    """A checkpoint a prune deletes, as confirmed: its path and size (another checkpoint under
    the same name has other bytes)."""

    path: str
    step: int | None = None
    bytes: int = 0
    kind: str = "verified"  # verified | rejected


class Spared(msgspec.Struct, kw_only=True):
    path: str = ""
    step: int | None = None
    why: str = ""


class PruneShown(msgspec.Struct, kw_only=True):
    """A prune's plan as shown and confirmed: what is deleted under which root, what is kept
    and why; the CLI prints them as `prune --root` does, the control room one a line."""

    root: str
    keep: int = 0
    bytes_to_free: int = 0
    delete: list[Doomed] = []
    kept: list[Spared] = []
    skipped: list[Spared] = []


@dataclass
class PruneWork:
    plan: pruning.PrunePlan
    protect: list[str]
    arrived: list[pruning.PruneTarget] = field(default_factory=list)  # eligible since confirmed
    no_longer: list[pruning.Kept] = field(default_factory=list)  # confirmed, no longer eligible


class Prune(Action[PruneArgs, PruneWork, PruneShown]):
    spec = ActionSpec(
        name="prune",
        key="P",
        description="Prune checkpoints, keeping the last verified ones, pinned and latest",
        cli_verb=False,
        destructive=True,
        when="the run has checkpoints not yet pruned",
        question="Delete these checkpoints?",
    )
    Args = PruneArgs
    Target = PruneShown

    def validate(self, args: PruneArgs) -> str | None:
        if args.keep is not None and argtypes.checked(args.keep, 0, 1_000_000, whole=True) is None:
            return f"keep must be a whole number >= 0, got {args.keep!r}"
        return None

    def not_offered(self, state: RunState, args: PruneArgs) -> str | None:
        # The keeper plans a prune of its checkpoint root whatever the run saw (earlier runs may
        # share it); a client offers one only when this run has checkpoints.
        if not any(c.state != "pruned" for c in state.checkpoints):
            return "no checkpoints to prune"
        return None

    def dry_run(self, args: PruneArgs) -> bool:
        return args.dry_run

    async def plan(self, k: Keeper, args: PruneArgs, call: Call) -> Plan[PruneWork, PruneShown] | Refused:
        keep = k.ckpt_keep() if args.keep is None else args.keep
        a = k.run.state.attempt
        resumed_from = a.resume_from if a is not None and a.ended_at is None else None
        protect = [x for x in [*k.verifying(), resumed_from] if x]
        root = k.ckpt_root()
        plan = await asyncio.to_thread(
            pruning.plan, root, keep, protect=protect, include_rejected=args.include_rejected
        )
        if not plan.delete:
            # Nothing to ask a yes or no for: said as the answer, with what is kept and why.
            return Refused(
                f"nothing to delete under {plan.root}: {len(plan.kept)} checkpoint(s) kept "
                f"(keeping {keep} verified, `latest` and pinned ones)"
                + (f", {len(plan.skipped)} skipped" if plan.skipped else ""),
                prune_target(plan, keep),
            )
        msg = (
            f"prune {len(plan.delete)} checkpoint(s) under {plan.root}, keeping {keep} verified: "
            f"{fmt_bytes(plan.bytes_to_free)} to free"
        )
        return Plan(msg, prune_target(plan, keep), PruneWork(plan, protect))

    async def execute(
        self, k: Keeper, args: PruneArgs, plan: Plan[PruneWork, PruneShown], call: Call
    ) -> Outcome:
        usage = k.disk_usage()
        before = {"disk_used_bytes": usage.used_bytes if usage else None}
        res = await asyncio.to_thread(
            pruning.execute, plan.work.plan, dry_run=False, protect=plan.work.protect
        )
        now = time.time()
        # A pruned step directory is the promoted form of a candidate the run knows by its path.
        by_dir = {c.report.promoted_dir: c.path for c in k.run.state.checkpoints if c.report is not None}
        for d in res.deleted:
            k.recorder.emit(
                p.CheckpointState(
                    path=by_dir.get(d.path, d.path), step=d.step, state="pruned", t=now, size_bytes=d.bytes
                )
            )
        sample = await asyncio.to_thread(k.disk_sample)
        after = {
            "disk_used_bytes": sample.used_bytes,
            "bytes_freed": res.bytes_freed,
            "deleted": [{"step": d.step, "path": d.path, "bytes": d.bytes} for d in res.deleted],
            "failed": [{"step": f.step, "path": f.path, "why": f.why} for f in res.failed],
        }
        work = plan.work
        if work.arrived:
            after["arrived_since"] = [
                {"step": t.step, "path": t.path, "bytes": t.bytes} for t in work.arrived
            ]
        if work.no_longer:
            after["no_longer_eligible"] = [
                {"step": x.step, "path": x.path, "why": x.why} for x in work.no_longer
            ]
        msg = (
            f"pruned {len(res.deleted)} checkpoint(s), freed {fmt_bytes(res.bytes_freed)}, kept {len(res.kept)}"
            + (f"; {len(res.failed)} failed: {res.failed[0].why}" if res.failed else "")
            + (
                f"; {len(work.no_longer)} confirmed no longer eligible, not deleted "
                f"({words.steps(x.step for x in work.no_longer)})"
                if work.no_longer
                else ""
            )
            + (
                f"; {len(work.arrived)} eligible since the confirmation, not deleted "
                f"({words.steps(t.step for t in work.arrived)})"
                if work.arrived
                else ""
            )
        )
        return Outcome(not res.failed, msg, before, after)

    def identity(self, plan: PruneShown) -> object:
        return (plan.root, sorted((d.path, d.bytes) for d in plan.delete))

    def narrowed(self, confirmed: object, now: object) -> bool:
        # Checkpoints that became eligible since (the run saved more) are left out of what is
        # carried out (`as_confirmed`); ones no longer eligible are not deleted. A confirmed
        # path whose bytes changed is another checkpoint under the same name: a change.
        if not (isinstance(confirmed, tuple) and isinstance(now, tuple)) or confirmed[0] != now[0]:
            return False
        was, is_ = dict(confirmed[1]), dict(now[1])
        return all(is_[path] == size for path, size in was.items() if path in is_)

    def what_changed(self, confirmed: object, now: object) -> str:
        if isinstance(confirmed, tuple) and isinstance(now, tuple):
            if confirmed[0] != now[0]:
                return f"confirmed a prune of {confirmed[0]}, now of {now[0]}"
            was, is_ = dict(confirmed[1]), dict(now[1])
            for path, size in was.items():
                if path in is_ and is_[path] != size:
                    return f"{path} was {fmt_bytes(size)} when confirmed, now {fmt_bytes(is_[path])}"
            return f"confirmed {len(was)} checkpoint(s) to delete, now {len(is_)}"
        return super().what_changed(confirmed, now)

    def headline(self, plan: PruneShown, summary: str) -> str:
        delete, kept = plan.delete, plan.kept
        if not delete:
            return f"deletes nothing under {plan.root}: every checkpoint is kept"
        steps = sorted(d.step for d in delete if d.step is not None)
        which = (
            f" (steps {steps[0]} to {steps[-1]})"
            if len(steps) > 1
            else f" ({words.steps(steps)})"
            if steps
            else ""
        )
        return (
            f"deletes {len(delete)} checkpoint{'s' if len(delete) != 1 else ''}{which} under "
            f"{plan.root} for good, {fmt_bytes(plan.bytes_to_free)} freed; keeps {len(kept)}"
        )

    def plan_lines(self, plan: PruneShown) -> list[str]:
        # The counts and what is kept first: a person reads them before the next save, the
        # paths after.
        delete, kept = plan.delete, plan.kept
        out = [
            f"  deletes {len(delete)} checkpoint(s) under {plan.root}, {fmt_bytes(plan.bytes_to_free)} freed",
            f"  keeps {len(kept)}: "
            + ("; ".join(f"{words.steps([k.step])} ({k.why})" for k in kept) or "none"),
        ]
        out += [f"  left alone: {x.path} ({x.why})" for x in plan.skipped]
        out += [
            f"    {words.steps([d.step])}  {fmt_bytes(d.bytes)}  {d.path}"
            + ("  (rejected)" if d.kind == "rejected" else "")
            for d in delete
        ]
        return out

    def detail_lines(self, plan: PruneShown) -> list[str]:
        return self.plan_lines(plan)[1:]  # the headline says the count, the bytes and the root

    def as_confirmed(
        self, plan: Plan[PruneWork, PruneShown], confirmed: PruneShown
    ) -> Plan[PruneWork, PruneShown]:
        shown = {d.path: d.step for d in confirmed.delete}
        part = pruning.confirmed_part(plan.work.plan, shown)
        work = PruneWork(part.plan, plan.work.protect, part.arrived, part.no_longer)
        return Plan(plan.summary, prune_target(part.plan, plan.target.keep), work)


def prune_target(plan: pruning.PrunePlan, keep: int) -> PruneShown:
    """A prune plan as shown and confirmed."""
    return PruneShown(
        root=plan.root,
        keep=keep,
        bytes_to_free=plan.bytes_to_free,
        delete=[Doomed(step=d.step, path=d.path, bytes=d.bytes, kind=d.kind) for d in plan.delete],
        kept=[Spared(step=k.step, path=k.path, why=k.why) for k in plan.kept],
        skipped=[Spared(step=k.step, path=k.path, why=k.why) for k in plan.skipped],
    )
