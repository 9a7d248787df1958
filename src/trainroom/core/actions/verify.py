"""verify: a checkpoint's digest, NaN/Inf, shapes and outlier stds, in the keeper's verifier
(the root's `latest`, else the newest verified watched file, else the path given)."""

from __future__ import annotations

import asyncio
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
)
from trainroom.core.ckpt.layout import latest_checkpoint
from trainroom.core.ckpt.report import Expected, decode_expected
from trainroom.core.run.state import RunState


class VerifyArgs(Args, kw_only=True):
    path: Annotated[str | None, arg("the checkpoint to verify (default: `latest`)")] = None
    expected: dict[str, Any] | None = None  # what the checkpoint must hold (see `verify --expect-json`)


class VerifyShown(msgspec.Struct, kw_only=True):
    path: str  # the checkpoint verified


class Verify(Action[VerifyArgs, Expected | None, VerifyShown]):
    spec = ActionSpec(
        name="verify",
        key="v",
        description="Verify the latest checkpoint (digest, NaN/Inf, shapes, outlier std)",
        cli_verb=False,
        destructive=False,
        cancellable=True,
        when="the run has a checkpoint to verify",
    )
    Args = VerifyArgs
    Target = VerifyShown

    def validate(self, args: VerifyArgs) -> str | None:
        try:
            decode_expected(args.expected) if args.expected is not None else None
        except ValueError as exc:
            return f"expected {exc}"
        return None

    def not_offered(self, state: RunState, args: VerifyArgs) -> str | None:
        # The keeper verifies `latest` (or the newest watched checkpoint): a run whose every
        # checkpoint was rejected has none, and the keeper would refuse.
        if not any(c.state == "verified" for c in state.checkpoints):
            return "no verified checkpoint to verify yet (`latest` points nowhere)"
        return None

    async def plan(
        self, k: Keeper, args: VerifyArgs, call: Call
    ) -> Plan[Expected | None, VerifyShown] | Refused:
        path = args.path or str(latest_checkpoint(k.ckpt_root()) or "") or (k.newest_watched() or "")
        if not path:
            return Refused("nothing to verify: no checkpoint has verified yet (`latest` points nowhere)")
        expected = decode_expected(args.expected) if args.expected is not None else None
        return Plan(f"verify {path}", VerifyShown(path=path), expected)

    async def execute(
        self, k: Keeper, args: VerifyArgs, plan: Plan[Expected | None, VerifyShown], call: Call
    ) -> Outcome:
        path = plan.target.path
        call.say(f"verifying {path}")
        rep = await asyncio.to_thread(k.verify_now, path, plan.work)
        summary = (
            f"{path}: {'verified' if rep.ok else 'REJECTED: ' + str(rep.reason)}; "
            f"{rep.tensors} tensors, {rep.params} params, "
            f"non-finite {len(rep.nonfinite)}, outliers {len(rep.outliers)}"
        )
        return Outcome(rep.ok, summary, after=as_builtins(msgspec.structs.replace(rep, stds={})))

    def identity(self, plan: VerifyShown) -> object:
        return plan.path
