"""bench: a matmul TFLOPS figure on the run's device, with the trainer's interpreter: is the
hardware fine?"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from trainroom.core.actions.base import Action, ActionSpec, Args, Call, Keeper, Outcome, Plan, Refused, arg
from trainroom.core.configuration import argtypes
from trainroom.core.ops.bench import describe, device_arg, run_bench, seconds_arg


class BenchArgs(Args, kw_only=True):
    device: Annotated[str, arg("cpu, cuda or cuda:N (default: cuda:0 if there is one)", parse=device_arg)] = (
        "auto"
    )
    seconds: Annotated[
        float | None,
        arg("timed duration (default: [bench] seconds in trainroom.toml, else 1)", parse=seconds_arg),
    ] = None


class BenchShown(msgspec.Struct, kw_only=True):
    device: str = "auto"
    python: str | None = None  # the trainer's interpreter the bench runs under


class Bench(Action[BenchArgs, None, BenchShown]):
    spec = ActionSpec(
        name="bench",
        key="b",
        description="Run the matmul bench on the run's device: is the hardware fine?",
        destructive=False,
        cancellable=True,
    )
    Args = BenchArgs
    Target = BenchShown

    def validate(self, args: BenchArgs) -> str | None:
        if args.seconds is not None and argtypes.checked(args.seconds, 0.01, 60) is None:
            return f"seconds must be in (0, 60], got {args.seconds!r}"
        return None

    async def plan(self, k: Keeper, args: BenchArgs, call: Call) -> Plan[None, BenchShown] | Refused:
        target = BenchShown(device=args.device, python=k.run.trainer_python())
        return Plan(f"matmul bench on {args.device} (~1 s)", target, None)

    async def execute(self, k: Keeper, args: BenchArgs, plan: Plan[None, BenchShown], call: Call) -> Outcome:
        call.say(f"running the matmul bench on {args.device}")
        cfg = k.run.settings.bench
        cancel = threading.Event()
        try:
            out = await asyncio.to_thread(
                run_bench,
                args.device,
                python=plan.target.python,
                seconds=float(args.seconds or cfg.seconds),
                floor_tflops=cfg.floor_tflops,
                cancel=cancel,
            )
        except asyncio.CancelledError:
            cancel.set()  # the bench's child is killed, not left to run out its time
            raise
        return Outcome(out.ok, describe(out), after=out.as_dict(), target=BenchShown(device=args.device))

    def passed(self, ok: bool, after: Mapping[str, Any]) -> bool:
        return ok and after.get("verdict") == "ok"  # below its floor: ran, but not a pass

    def identity(self, plan: BenchShown) -> object:
        return None  # nothing to change under it
