"""Actions a client asks the keeper for: each has a plan (the exact target, shown for
confirmation) and an execution (with before/after evidence), and each outcome is journaled."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from . import protocol as p

if TYPE_CHECKING:
    from .keeper import Keeper

Reply = Callable[[p.Reply], None]
Handler = Callable[["Keeper", p.Request, Reply], Awaitable[None]]

KNOWN = ("kill", "reclaim", "prune", "resume", "dump", "verify", "bench")


class Actions:
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper
        self.handlers: dict[str, Handler] = {}

    async def serve(self, keeper: Keeper, req: p.Request, reply: Reply, client: str) -> None:
        handler = self.handlers.get(req.action)
        if handler is None:
            known = req.action in KNOWN
            msg = (f"{req.action}: not available in this build yet" if known
                   else f"unknown action {req.action!r} (known: {', '.join(KNOWN)})")
            reply(p.Reply(id=req.id, action=req.action, stage="done", ok=False, message=msg))
            return
        await handler(keeper, req, reply)


def journal_action(keeper: Keeper, action: str, ok: bool, message: str, target: dict[str, Any],
                   before: dict[str, Any], after: dict[str, Any], client: str = "") -> None:
    keeper.emit(p.ActionRecord(action=action, t=time.time(), ok=ok, message=message, target=target,
                               before=before, after=after, client=client))
    keeper.journal.flush(fsync=True)
