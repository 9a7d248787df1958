"""What every action is: a spec (its wire name, key, words, whether it asks first and whether it
can be cancelled), typed arguments, a precondition on the run's state, a plan with its target,
and an execution. `Action.serve` carries any action through plan -> confirm -> execute once: a
confirmed request carries the plan the client showed (`args["expect"]`), the keeper plans again
and refuses, naming the difference, when the target is not the one confirmed.

The precondition is a pure function of the run's state: the keeper refuses with its words, and
the control room offers the action's key only when it holds (and says the same words when not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import msgspec

from trainroom.core.actions import options, words
from trainroom.core.actions.options import arg as arg  # what each Args field declares
from trainroom.core.ckpt.report import Expected, VerifyReport
from trainroom.core.configuration.settings import RunSettings
from trainroom.core.health.diskguard import DiskUsage
from trainroom.core.ops.resume import ResumePlan
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.run.ended import live_attempt as live_attempt
from trainroom.core.run.ended import not_running as not_running
from trainroom.core.run.state import RunState
from trainroom.core.samples import DiskSample
from trainroom.core.vocab import ActionName
from trainroom.core.wire import protocol as p

Reply = Callable[[p.Reply], None]
Say = Callable[[str], None]


@dataclass(frozen=True)
class ActionSpec:
    """An action as every client names it: its name on the wire, its key, what it does."""

    name: ActionName  # the protocol's `Request.action`, and what a finding's `action` names
    # The control room's default key, in Textual's names (`trainroom.toml` [keys] remaps it).
    # What changes the world takes a capital or a ctrl chord (k9s kills with ctrl+k), never a
    # letter a vim, k9s or lazygit user presses to move: j/k/g/G scroll, / searches.
    key: str
    description: str  # one line: the help screen, the palette, the CLI's help, the docs
    destructive: bool  # changes the world: clients show the keeper's plan and ask first
    cancellable: bool = False  # long, and safe to stop midway (`cancel ACTION`)
    # What the precondition checks, in words (the docs' action table).
    when: str = "always"
    needs_keeper: bool = True  # False: a client can act without the run's keeper (a resume)
    # The CLI's verb of the same name asks the keeper (False: a verb of its own also works on a
    # bare directory without a keeper, `trainroom verify` / `prune`, see cli/ckpt.py).
    cli_verb: bool = True
    # What a confirmation asks (the control room's confirm screen; default "Name?").
    question: str = ""
    # What a cancel ends, where it is less than the whole action (a kill's: the wait, never
    # its signalling): the control room's strip says "X: cancel the wait".
    cancel_ends: str = "it"

    @property
    def through_bridge(self) -> bool:
        """The verb asks the run's keeper: on a run of another host while its keeper lives, the
        CLI here dials it through `ssh HOST trainroom bridge` (core/cli/remote.py); a verb of its
        own (verify, prune) runs on that host."""
        return self.cli_verb

    def ask(self) -> str:
        return self.question or f"{self.name.capitalize()}?"


class Recorder(Protocol):
    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...

    def flush(self, *, fsync: bool = False) -> None: ...


class RunView(Protocol):
    @property
    def state(self) -> RunState: ...

    @property
    def settings(self) -> RunSettings: ...

    @property
    def run_id(self) -> str: ...

    @property
    def log_path(self) -> Path: ...

    def trainer_python(self) -> str: ...


class Keeper(Protocol):
    """What an action may use of the keeper that serves it (the keeper's services, narrowed)."""

    @property
    def recorder(self) -> Recorder: ...

    @property
    def run(self) -> RunView: ...

    @property
    def gpu(self) -> GpuProbe: ...

    def ckpt_root(self) -> Path: ...

    def ckpt_keep(self) -> int: ...

    def verifying(self) -> frozenset[str]: ...

    def disk_usage(self) -> DiskUsage | None: ...

    def disk_sample(self) -> DiskSample: ...

    def newest_watched(self) -> str | None:
        """The newest verified watched file's path (a trainer's overwritten ckpt.pt)."""

    def verify_now(self, path: str, expected: Expected | None) -> VerifyReport: ...

    async def wait_in_flight(self, bound_s: float, say: Say) -> list[tuple[str, float]]: ...

    async def resume_plan(self) -> ResumePlan: ...

    async def resume_start(self, plan: ResumePlan, say: Say) -> Outcome: ...


class Args(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """An action's arguments (`Request.args`, less `expect`), typed; each action names its own."""


A = TypeVar("A", bound=Args)
W = TypeVar("W")
T = TypeVar("T", bound=msgspec.Struct)


class Proc(msgspec.Struct, kw_only=True):
    """A process as a plan shows it and a confirmation proves it: its pid and start tick (what
    tells it from a reused pid), and what a person reads of it."""

    pid: int
    start_ticks: int | None = None
    cmdline: list[str] = []
    state: str | None = None
    ppid: int | None = None
    pgid: int | None = None
    create_time: float | None = None
    rss_bytes: int | None = None
    in_group: bool = True
    run: str | None = None


def procs(members: Any) -> list[Proc]:
    """ops' `Member`s as a plan's processes."""
    return [msgspec.convert(msgspec.to_builtins(m), Proc) for m in members]


@dataclass
class Plan(Generic[W, T]):
    """A plan: what a client shows for confirmation (`summary`, `target`: the action's typed
    plan) and what the execution carries out (`work`: an ops plan)."""

    summary: str
    target: T
    work: W


@dataclass(frozen=True)
class Refused:
    why: str
    target: msgspec.Struct | None = None  # the plan refused, when there is one to show


@dataclass
class Outcome:
    ok: bool
    message: str
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    target: msgspec.Struct | None = None  # what the result names, when not the confirmed target


@dataclass(frozen=True)
class Call:
    """Who asked, and how to tell them how it goes."""

    client: str
    say: Say


def as_builtins(x: msgspec.Struct | None) -> dict[str, Any]:
    """A Struct as the wire carries it (`Reply.plan`, `args["expect"]`); None as no fields."""
    if x is None:
        return {}
    out = msgspec.to_builtins(x)
    assert isinstance(out, dict)
    return out


class Action(Generic[A, W, T]):
    """One action. A subclass gives `spec`, `Args`, `Target` (its plan as shown), and overrides
    `precondition`, `plan`, `execute` and, where a confirmation is of something narrower than the
    whole plan, `identity` / `narrowed` / `what_changed`."""

    spec: ClassVar[ActionSpec]
    Args: type[A]
    Target: type[T]

    # ------------------------------------------------------------ what a subclass says
    # (its arguments, with their CLI flags and help, are its `Args` fields: actions/options.py)

    def validate(self, args: A) -> str | None:
        """Why the arguments cannot be used (None: they can); checked before anything is planned."""
        return None

    def precondition(self, state: RunState, args: A) -> str | None:
        """Why the action cannot act on this run now, in words; None when it can."""
        return None

    def not_offered(self, state: RunState, args: A) -> str | None:
        """Why a client should not offer the action now although the keeper would carry it out
        (a kill of a trainer that is gone only confirms its memory was released: a check, not a
        fix); None when it is worth offering. Said after the precondition."""
        return None

    def passed(self, ok: bool, after: Mapping[str, Any]) -> bool:
        """Whether a done result is a pass (the CLI's exit 0): carried out, unless an action
        says more (a bench that ran but measured below its floor is not)."""
        return ok

    def dry_run(self, args: A) -> bool:
        """A confirmed request that only says what it would do."""
        return False

    async def plan(self, k: Keeper, args: A, call: Call) -> Plan[W, T] | Refused:
        raise NotImplementedError

    async def execute(self, k: Keeper, args: A, plan: Plan[W, T], call: Call) -> Outcome:
        raise NotImplementedError

    def identity(self, plan: T) -> object:
        """What a confirmation is a confirmation of: the exact targets of a plan, compared
        between the plan a client confirmed and the one about to be carried out. The whole plan
        unless an action says less; None: nothing could change under it (no plan to carry)."""
        return plan

    def narrowed(self, confirmed: object, now: object) -> bool:
        """Whether acting on the confirmed part of the target now acts on nothing unconfirmed:
        it only lost what ended on its own since it was confirmed (a kill's ranks that exited),
        or gained only what `as_confirmed` leaves out (a prune's checkpoints saved since)."""
        return False

    def what_changed(self, confirmed: object, now: object) -> str:
        return f"confirmed {confirmed!r}, now {now!r}"

    def headline(self, plan: T, summary: str) -> str:
        """The one line a confirmation opens with: what will happen to what, and what is lost
        (`summary`: the keeper's one-line plan, the default). The details follow: `plan_lines`."""
        return summary

    def plan_lines(self, plan: T) -> list[str]:
        """The plan as a person reads it under its one-line summary: what happens to what and
        what is lost first, then the details in words and units (actions/words.py)."""
        return ["  " + line for line in words.plan_fields(as_builtins(plan))]

    def detail_lines(self, plan: T) -> list[str]:
        """The plan's lines under its `headline`: `plan_lines` less what the headline says."""
        return self.plan_lines(plan)

    def as_confirmed(self, plan: Plan[W, T], confirmed: T) -> Plan[W, T]:
        """The plan to carry out, cut to what the client confirmed (`confirmed`: the plan it
        showed), for an action whose target may grow while a person reads it (a prune of a run
        that keeps saving: what arrived since is named, not acted on). The plan as planned
        unless an action says more."""
        return plan

    # ------------------------------------------------------------ the same for every action

    def decode(self, raw: object) -> T | None:
        """A plan off the wire (`Reply.plan`, `args["expect"]`) as this action's `Target`; None
        when it is not one (absent, or of a shape this code does not know: an older keeper's)."""
        if not isinstance(raw, Mapping) or not raw:
            return None
        try:
            return msgspec.convert(dict(raw), self.Target, strict=False)
        except msgspec.ValidationError:
            return None

    def args_of(self, raw: Mapping[str, Any], *, complete: bool = True) -> A | str:
        """The request's arguments, typed; or why they cannot be (`complete`: with every
        required one given; a client deciding whether to offer the key asks for them later)."""
        given = {k: v for k, v in raw.items() if k != p.EXPECT}
        try:
            args = msgspec.convert(given, self.Args)
        except msgspec.ValidationError as exc:
            return f"{self.spec.name}: bad arguments: {exc}"
        lacking = [o.flag for o in options.missing(self.Args, given)] if complete else []
        if lacking:
            return f"{self.spec.name}: bad arguments: {', '.join(lacking)} is required"
        return args

    def refusal(self, state: RunState, raw: dict[str, Any], *, offer: bool = False) -> str | None:
        """The precondition on raw request arguments, in the keeper's words (`offer`: and
        whether a client should offer it now, see `not_offered`; an argument it has not asked
        for yet is not a reason)."""
        args = self.args_of(raw, complete=not offer)
        if isinstance(args, str):
            return args
        why = self.validate(args) or self.precondition(state, args)
        return why if why is not None or not offer else self.not_offered(state, args)

    async def serve(self, k: Keeper, req: p.Request, reply: Reply, client: str) -> None:
        name = self.spec.name
        args = self.args_of(req.args)
        if isinstance(args, str):
            reply(done_reply(req, False, args))
            return
        bad = self.validate(args)
        if bad is not None:
            reply(done_reply(req, False, f"{name}: {bad}"))
            return
        why = self.precondition(k.run.state, args)
        if why is not None:
            reply(done_reply(req, False, f"{name} refused: {why}"))
            return
        call = Call(client=client, say=progress_to(reply, req))
        planned = await self.plan(k, args, call)
        if isinstance(planned, Refused):
            reply(done_reply(req, False, f"{name} refused: {planned.why}", plan=as_builtins(planned.target)))
            return
        shown = as_builtins(planned.target)
        if not req.confirm:
            reply(p.Reply(id=req.id, action=name, stage="plan", message=planned.summary, plan=shown))
            return
        if self.dry_run(args):
            reply(done_reply(req, True, planned.summary, plan=shown))
            return
        expect = self.decode(req.args.get(p.EXPECT))
        if not self.confirmed(req, reply, planned.target, expect):
            return
        if expect is not None:
            planned = self.as_confirmed(planned, expect)
        out = await self.execute(k, args, planned, call)
        target = as_builtins(planned.target if out.target is None else out.target)
        reply(done_reply(req, out.ok, out.message, plan=target, before=out.before, after=out.after))

    def confirmed(self, req: p.Request, reply: Reply, plan: T, expect: T | None) -> bool:
        """False (and a refusal sent) when a confirmed request's plan is not the one to run."""
        name = self.spec.name
        now = self.identity(plan)
        if now is None:
            return True  # nothing can change under it (a bench): nothing to confirm
        if expect is None:
            reply(
                done_reply(
                    req,
                    False,
                    f"{name}: confirm with the plan you confirmed (args.expect)",
                    plan=as_builtins(plan),
                )
            )
            return False
        was = self.identity(expect)
        if was != now and not self.narrowed(was, now):
            reply(
                done_reply(
                    req,
                    False,
                    f"{name} refused: the target changed since it was confirmed "
                    f"({self.what_changed(was, now)}); look at the new plan and confirm again",
                    plan=as_builtins(plan),
                )
            )
            return False
        return True


def progress_to(reply: Reply, req: p.Request) -> Say:
    loop = asyncio.get_running_loop()

    def say(line: str) -> None:
        loop.call_soon_threadsafe(
            reply, p.Reply(id=req.id, action=req.action, stage="progress", message=line)
        )

    return say


def done_reply(req: p.Request, ok: bool, message: str, **kw: Any) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="done", ok=ok, message=message, **kw)
