"""The keeper's side of the actions: it serves each request through the action registry
(`core/actions`: one module per action, its precondition, plan and execution), journals every
outcome, done or refused, lets a client cancel a long one, and gives the actions the keeper's
services (`core.actions.base.Keeper`). Blocking work runs in a worker thread; progress lines go
back to the asking client as they happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from trainroom.core.actions.base import Outcome, Reply, Say, done_reply
from trainroom.core.actions.registry import CANCELLABLE, NAMES, REGISTRY
from trainroom.core.ckpt.report import Expected, VerifyReport
from trainroom.core.health.diskguard import DiskUsage
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.keeper.recovery import Resumer, watched_target
from trainroom.core.ops.resume import ResumePlan
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.samples import DiskSample
from trainroom.core.wire import protocol as p

Handler = Callable[[p.Request, Reply], Awaitable[None]]
KNOWN = NAMES


class Actions:
    """The registry's actions served with the keeper's services; `handlers` takes the keeper's
    own requests that are not actions (a notification test)."""

    def __init__(
        self,
        recorder: Recorder,
        run: RunContext,
        pipeline: CheckpointPipeline,
        resumer: Resumer,
        gpu: GpuProbe,
    ) -> None:
        self.recorder = recorder
        self.run = run
        self.pipeline = pipeline
        self.resumer = resumer
        self.gpu = gpu
        self.handlers: dict[str, Handler] = {}
        self._busy: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # action -> the task carrying it out

    @property
    def busy(self) -> bool:
        """A confirmed action is being carried out: the keeper does not rest or exit meanwhile."""
        return bool(self._busy or self._running)

    async def serve(self, req: p.Request, reply: Reply, client: str) -> None:
        if req.action == "cancel":
            self._cancel(req, reply)
            return
        action = REGISTRY.get(req.action)
        handler = self.handlers.get(req.action)
        if action is None and handler is None:
            msg = f"unknown action {req.action!r} (known: {', '.join(KNOWN)})"
            reply(done_reply(req, False, msg))
            return
        if req.confirm and req.action in self._busy:
            reply(done_reply(req, False, f"{req.action} is already running"))
            return
        if req.confirm:
            self._busy.add(req.action)
        send = self._journaling(req, reply, client)
        task = asyncio.current_task()
        if req.confirm and task is not None and req.action in CANCELLABLE:
            self._running[req.action] = task
        try:
            if action is not None:
                await action.serve(self, req, send, client)
            elif handler is not None:
                await handler(req, send)
        except asyncio.CancelledError:
            send(done_reply(req, False, f"{req.action} cancelled by a client before it finished"))
        finally:
            self._running.pop(req.action, None)
            if req.confirm:
                self._busy.discard(req.action)

    def _cancel(self, req: p.Request, reply: Reply) -> None:
        """`cancel` {action}: stop a long action (a bench, a verify, a resume still waiting for a
        verdict, a kill's wait for the VRAM). A kill's signals or a prune are never cut off
        half-way: a kill ends only its wait, a prune is not cancellable."""
        name = str(req.args.get("action", ""))
        task = self._running.get(name)
        if name not in CANCELLABLE:
            reply(
                done_reply(
                    req,
                    False,
                    f"cancel: {name or 'nothing'} cannot be cancelled (only {', '.join(CANCELLABLE)})",
                )
            )
        elif task is None or task.done():
            reply(done_reply(req, False, f"cancel: no {name} is running"))
        else:
            task.cancel()
            reply(done_reply(req, True, f"cancel: {name} is being cancelled"))

    def _journaling(self, req: p.Request, reply: Reply, client: str) -> Reply:
        """Journal every `done` of a confirmed request (or a refusal of any) as it is sent."""

        def send(r: p.Reply) -> None:
            if r.stage == "done" and (req.confirm or not r.ok):
                self.recorder.emit(
                    p.ActionRecord(
                        action=r.action,
                        t=time.time(),
                        ok=r.ok,
                        message=r.message,
                        target=r.plan,
                        before=r.before,
                        after=r.after,
                        client=client,
                    )
                )
                self.recorder.flush(fsync=True)
            reply(r)

        return send

    # ------------------------------------------------------------ the services actions use

    def ckpt_root(self) -> Path:
        return self.pipeline.root

    def ckpt_keep(self) -> int:
        return self.pipeline.keep

    def verifying(self) -> frozenset[str]:
        return self.pipeline.verifying

    def disk_usage(self) -> DiskUsage | None:
        return self.pipeline.usage

    def disk_sample(self) -> DiskSample:
        return self.pipeline.disk_sample()

    def newest_watched(self) -> str | None:
        watched = watched_target(self.pipeline)
        return watched.path if watched else None

    def verify_now(self, path: str, expected: Expected | None) -> VerifyReport:
        return self.pipeline.verify_now(path, expected)

    async def wait_in_flight(self, bound_s: float, say: Say) -> list[tuple[str, float]]:
        return await self.pipeline.wait_in_flight(bound_s, say)

    async def resume_plan(self) -> ResumePlan:
        return await self.resumer.plan()

    async def resume_start(self, plan: ResumePlan, say: Say) -> Outcome:
        r = await self.resumer.start(plan, progress=say)
        return Outcome(r.ok, r.message, dict(r.before), dict(r.after))
