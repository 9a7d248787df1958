"""Replies to a client's action request, and what a confirmation is a confirmation of.

Every action is plan -> confirm -> execute that plan: `target_of` extracts the exact targets of a
plan (pids with start ticks, paths, a checkpoint and a command), compared between the plan the
client confirmed and the one the keeper is about to carry out; `what_changed` says the
difference in words when they are not the same."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ops import prune as pruning

Reply = Callable[[p.Reply], None]
Handler = Callable[[p.Request, Reply], Awaitable[None]]


def progress_to(reply: Reply, req: p.Request) -> Callable[[str], None]:
    loop = asyncio.get_running_loop()

    def say(line: str) -> None:
        loop.call_soon_threadsafe(
            reply, p.Reply(id=req.id, action=req.action, stage="progress", message=line)
        )

    return say


def done_reply(req: p.Request, ok: bool, message: str, **kw: Any) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="done", ok=ok, message=message, **kw)


def result_reply(
    req: p.Request, ok: bool, message: str, plan: dict[str, Any], result: dict[str, Any]
) -> p.Reply:
    """An executed plan's outcome with its before -> after evidence (an ops result's as_dict())."""
    return done_reply(
        req, ok, message, plan=plan, before=result.get("before", {}), after=result.get("after", {})
    )


def plan_reply(req: p.Request, message: str, plan: dict[str, Any]) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="plan", message=message, plan=plan)


def as_builtins(x: msgspec.Struct) -> dict[str, Any]:
    out = msgspec.to_builtins(x)
    assert isinstance(out, dict)
    return out


def target_of(action: str, plan: dict[str, Any]) -> object:
    """What a confirmation is a confirmation of: the exact targets of a plan (pids with their
    start ticks, the paths a prune deletes, the checkpoint and command of a resume), compared
    between the plan a client confirmed and the one the keeper is about to carry out."""
    if action == "kill":
        return (
            plan.get("pgid"),
            sorted((m.get("pid"), m.get("start_ticks")) for m in plan.get("members") or []),
        )
    if action == "prune":
        return sorted((d.get("path"), d.get("bytes")) for d in plan.get("delete") or [])
    if action == "resume":
        return (plan.get("checkpoint"), plan.get("step"), plan.get("digest"), plan.get("argv"))
    if action == "reclaim":
        return (plan.get("method"), plan.get("target"))
    if action == "dump":
        return plan.get("pid")
    if action == "continue":
        return sorted((m.get("pid"), m.get("start_ticks")) for m in plan.get("members") or [])
    if action == "verify":
        return plan.get("path")
    return None  # bench: nothing to change under it


def narrowed(action: str, confirmed: object, now: object) -> bool:
    """Whether a signal's target only lost processes since it was confirmed (they ended on their
    own: a job's other node was killed first, a rank exited): signalling the rest acts on nothing
    unconfirmed, and refusing would leave them running. Any process added, or the same pid with
    another start tick, is a change."""
    if action == "kill" and isinstance(confirmed, tuple) and isinstance(now, tuple):
        return confirmed[0] == now[0] and set(now[1]) <= set(confirmed[1])
    if action == "continue" and isinstance(confirmed, list) and isinstance(now, list):
        return set(now) <= set(confirmed)
    return False


def what_changed(action: str, confirmed: object, now: object) -> str:
    if action == "kill" and isinstance(confirmed, tuple) and isinstance(now, tuple):
        was = [pid for pid, _ in confirmed[1]]
        is_ = [pid for pid, _ in now[1]]
        return f"confirmed pids {was} of pgid {confirmed[0]}, now {is_} of pgid {now[0]}"
    if action == "prune" and isinstance(confirmed, list) and isinstance(now, list):
        return f"confirmed {len(confirmed)} checkpoint(s) to delete, now {len(now)}"
    return f"confirmed {confirmed!r}, now {now!r}"


def prune_target(plan: pruning.PrunePlan, keep: int) -> dict[str, Any]:
    """A prune plan as records, not strings: the CLI prints them as `prune --root` does, the
    control room one a line."""
    return {
        "root": plan.root,
        "keep": keep,
        "bytes_to_free": plan.bytes_to_free,
        "delete": [{"step": d.step, "path": d.path, "bytes": d.bytes, "kind": d.kind} for d in plan.delete],
        "kept": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.kept],
        "skipped": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.skipped],
    }
