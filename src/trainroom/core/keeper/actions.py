"""Actions a client asks the keeper for. Each has a plan (the exact target, shown for
confirmation; `confirm=False` asks for it) and an execution with before/after evidence, and every
outcome, done or refused, is journaled. Blocking work runs in a worker thread; progress lines go
back to the asking client as they happen.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from trainroom.core import argtypes
from trainroom.core import protocol as p
from trainroom.core.ckpt.layout import latest_checkpoint
from trainroom.core.ckpt.report import decode_expected
from trainroom.core.findings import ACTIONS
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.keeper.recovery import Resumer
from trainroom.core.ops import flight
from trainroom.core.ops import prune as pruning
from trainroom.core.ops.bench import describe, run_bench
from trainroom.core.ops.kill import execute_kill, plan_kill
from trainroom.core.ops.members import Lifetime
from trainroom.core.ops.reclaim import execute_reclaim, plan_reclaim
from trainroom.core.ops.stacks import dump_stacks
from trainroom.core.ops.vram import run_vram_probe
from trainroom.core.ops.wake import execute_wake, plan_wake
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.units import fmt_bytes

Reply = Callable[[p.Reply], None]
RESUME_WAIT_S = 120.0
CANCELLABLE = (
    "bench",
    "verify",
    "dump",
    "resume",
)  # long, and safe to stop midway  # how long a resume waits for a checkpoint still in the verifier
Handler = Callable[[p.Request, Reply], Awaitable[None]]

KNOWN = tuple(a.name for a in ACTIONS)


def _progress(reply: Reply, req: p.Request) -> Callable[[str], None]:
    loop = asyncio.get_running_loop()

    def say(line: str) -> None:
        loop.call_soon_threadsafe(
            reply, p.Reply(id=req.id, action=req.action, stage="progress", message=line)
        )

    return say


def _done(req: p.Request, ok: bool, message: str, **kw: Any) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="done", ok=ok, message=message, **kw)


def _plan(req: p.Request, message: str, plan: dict[str, Any]) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="plan", message=message, plan=plan)


def _builtins(x: msgspec.Struct) -> dict[str, Any]:
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


def what_changed(action: str, confirmed: object, now: object) -> str:
    if action == "kill" and isinstance(confirmed, tuple) and isinstance(now, tuple):
        was = [pid for pid, _ in confirmed[1]]
        is_ = [pid for pid, _ in now[1]]
        return f"confirmed pids {was} of pgid {confirmed[0]}, now {is_} of pgid {now[0]}"
    if action == "prune" and isinstance(confirmed, list) and isinstance(now, list):
        return f"confirmed {len(confirmed)} checkpoint(s) to delete, now {len(now)}"
    return f"confirmed {confirmed!r}, now {now!r}"


class Actions:
    """The keeper's actions, each a method with the services it needs given at construction.

    Every action is plan -> confirm -> execute that plan: a confirmed request carries the plan
    the client showed (`args["expect"]`), the keeper plans again and refuses, naming the
    difference, when the targets are not the ones confirmed."""

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
        self.handlers: dict[str, Handler] = {
            "kill": self.kill,
            "reclaim": self.reclaim,
            "dump": self.dump,
            "continue": self.wake,
            "bench": self.bench,
            "prune": self.prune,
            "verify": self.verify,
            "resume": self.resume,
        }
        self._busy: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}  # action -> the task carrying it out

    def confirmed(self, req: p.Request, reply: Reply, plan: dict[str, Any]) -> bool:
        """False (and a refusal sent) when a confirmed request's plan is not the one to run."""
        expect = req.args.get("expect")
        if not isinstance(expect, dict):
            reply(
                _done(
                    req, False, f"{req.action}: confirm with the plan you confirmed (args.expect)", plan=plan
                )
            )
            return False
        was, now = target_of(req.action, expect), target_of(req.action, plan)
        if was != now:
            reply(
                _done(
                    req,
                    False,
                    f"{req.action} refused: the target changed since it was confirmed "
                    f"({what_changed(req.action, was, now)}); look at the new plan and confirm again",
                    plan=plan,
                )
            )
            return False
        return True

    async def serve(self, req: p.Request, reply: Reply, client: str) -> None:
        if req.action == "cancel":
            self._cancel(req, reply)
            return
        handler = self.handlers.get(req.action)
        if handler is None:
            msg = f"unknown action {req.action!r} (known: {', '.join(KNOWN)})"
            reply(_done(req, False, msg))
            return
        if req.confirm and req.action in self._busy:
            reply(_done(req, False, f"{req.action} is already running"))
            return
        if req.confirm:
            self._busy.add(req.action)
        send = self._journaling(req, reply, client)
        task = asyncio.current_task()
        if req.confirm and task is not None and req.action in CANCELLABLE:
            self._running[req.action] = task
        try:
            await handler(req, send)
        except asyncio.CancelledError:
            send(_done(req, False, f"{req.action} cancelled by a client before it finished"))
        finally:
            self._running.pop(req.action, None)
            if req.confirm:
                self._busy.discard(req.action)

    def _cancel(self, req: p.Request, reply: Reply) -> None:
        """`cancel` {action}: stop a long action (a bench, a verify, a resume still waiting for a
        verdict). A kill or a prune is never cut off half-way: they are not cancellable."""
        name = str(req.args.get("action", ""))
        task = self._running.get(name)
        if name not in CANCELLABLE:
            reply(
                _done(
                    req,
                    False,
                    f"cancel: {name or 'nothing'} cannot be cancelled (only {', '.join(CANCELLABLE)})",
                )
            )
        elif task is None or task.done():
            reply(_done(req, False, f"cancel: no {name} is running"))
        else:
            task.cancel()
            reply(_done(req, True, f"cancel: {name} is being cancelled"))

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

    # ------------------------------------------------------------------ kill

    async def kill(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.pid <= 0:
            reply(_done(req, False, "kill: this run has no attempt with a process group to kill"))
            return
        plan = await asyncio.to_thread(
            plan_kill,
            a.pid,
            a.pgid,
            a.start_time,
            attempt_start_ticks=a.start_ticks,
            keeper_pid=os.getpid(),
            run_id=self.run.run_id,
            attempt_ended_at=a.ended_at,
        )
        target = plan.as_dict()
        if not plan.ok and not plan.nothing_left:
            reply(_done(req, False, "kill refused: " + "; ".join(plan.refusals), plan=target))
            return
        pids = [m.pid for m in plan.members]
        if plan.nothing_left:
            # The attempt died whole (the seed's SIGKILL): nothing to signal, but a kill still
            # confirms the driver gave its memory back before anyone resumes.
            summary = (
                f"nothing left to kill of attempt {a.n}: process group {plan.pgid} has no live members; "
                "confirm the driver released its memory"
            )
        else:
            summary = f"kill process group {plan.pgid} of attempt {a.n}: {len(pids)} process(es) {pids}"
        if not req.confirm:
            reply(_plan(req, summary, target))
            return
        if not self.confirmed(req, reply, target):
            return
        cfg = self.run.settings.kill
        grace = argtypes.checked(req.args.get("grace_s", cfg.grace_s), 0, 3600)
        if grace is None:
            reply(
                _done(
                    req, False, f"kill: grace_s must be seconds in [0, 3600], got {req.args.get('grace_s')!r}"
                )
            )
            return
        probe = run_vram_probe(self.gpu, sorted({a.pid, *pids}))
        result = await asyncio.to_thread(
            execute_kill,
            plan,
            grace_s=float(grace),
            vram_probe=probe,
            tolerance_bytes=cfg.vram_tolerance_bytes,
            vram_timeout_s=cfg.vram_timeout_s,
            progress=_progress(reply, req),
            vram_poll_s=cfg.vram_poll_s,
        )
        r = result.as_dict()
        reply(
            _done(
                req,
                result.ok,
                result.message,
                plan=target,
                before=r.get("before", {}),
                after=r.get("after", {}),
            )
        )

    # ------------------------------------------------------------------ reclaim

    async def reclaim(self, req: p.Request, reply: Reply) -> None:
        roots = self.run.settings.roots
        plan = await asyncio.to_thread(plan_reclaim, roots.cgroup, roots.proc)
        target = plan.as_dict()
        if not req.confirm:
            cache = target.get("page_cache_bytes")
            msg = f"reclaim page cache via {plan.method} ({plan.target})" + (
                f": {fmt_bytes(cache)} cached now" if isinstance(cache, int) else ""
            )
            reply(_plan(req, msg, target))
            return
        if not self.confirmed(req, reply, target):
            return
        result = await asyncio.to_thread(
            execute_reclaim, plan, sys_root=roots.cgroup, proc_root=roots.proc, progress=_progress(reply, req)
        )
        r = result.as_dict()
        reply(
            _done(
                req,
                result.ok,
                result.message,
                plan=target,
                before=r.get("before", {}),
                after=r.get("after", {}),
            )
        )

    # ------------------------------------------------------------------ dump

    async def dump(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.ended_at is not None or a.pid <= 0:
            reply(_done(req, False, "dump: no live trainer to dump"))
            return
        # One rank's process (a job's hung-collective report): the pid its reporter proved by
        # SO_PEERCRED when it said hello, while it is still connected.
        pid, instrumented, who = a.pid, a.instrumented, f"pid {a.pid}"
        rank = req.args.get("rank")
        if rank is not None:
            r = self.run.state.ranks.get(rank) if isinstance(rank, int) else None
            if r is None or r.attempt != a.n or r.pid is None or not r.connected:
                reply(_done(req, False, f"dump: rank {rank} has no connected reporter in attempt {a.n}"))
                return
            pid, instrumented, who = r.pid, True, f"rank {rank} (pid {r.pid})"
        if not req.confirm:
            stopped = self.run.state.status == "hung" and "stopped" in self.run.state.status_reason
            how = (
                "py-spy (stopped: read without pausing)"
                if stopped or not instrumented
                else "SIGUSR1 (faulthandler)"
            )
            reply(_plan(req, f"dump stacks of {who} via {how}", {"pid": pid, "method": how}))
            return
        if not self.confirmed(req, reply, {"pid": pid}):
            return
        out = await asyncio.to_thread(dump_stacks, pid, str(self.run.log_path), instrumented)
        after: dict[str, Any] = {"method": out.method, "stacks": out.text}
        if isinstance(rank, int):
            after["flight_recorder"] = _builtins(await asyncio.to_thread(flight.trigger, pid, rank))
        reply(_done(req, out.ok, out.message, plan={"pid": pid}, after=after))

    # ------------------------------------------------------------------ continue

    async def wake(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.ended_at is not None or a.pid <= 0:
            reply(_done(req, False, "continue: no live trainer to continue"))
            return
        life = Lifetime(run_id=self.run.run_id, start_time=a.start_time, start_ticks=a.start_ticks)
        plan = await asyncio.to_thread(plan_wake, a.pgid, life)
        target = {"pgid": plan.pgid, "members": [_builtins(m) for m in plan.stopped]}
        if not plan.ok:
            reply(_done(req, False, "continue: " + "; ".join(plan.refusals), plan=target))
            return
        pids = [m.pid for m in plan.stopped]
        if not req.confirm:
            reply(_plan(req, f"SIGCONT {len(pids)} stopped process(es) of attempt {a.n}: {pids}", target))
            return
        if not self.confirmed(req, reply, target):
            return
        result = await asyncio.to_thread(execute_wake, plan)
        reply(_done(req, result.ok, result.message, plan=target, after=_builtins(result)))

    # ------------------------------------------------------------------ bench

    async def bench(self, req: p.Request, reply: Reply) -> None:
        device = str(req.args.get("device", "auto"))
        python = self.run.trainer_python()
        if not req.confirm:
            reply(_plan(req, f"matmul bench on {device} (~1 s)", {"device": device, "python": python}))
            return
        reply(
            p.Reply(
                id=req.id,
                action=req.action,
                stage="progress",
                message=f"running the matmul bench on {device}",
            )
        )
        cfg = self.run.settings.bench
        seconds = argtypes.checked(req.args.get("seconds") or cfg.seconds, 0.01, 60)
        if seconds is None:
            reply(_done(req, False, f"bench: seconds must be in (0, 60], got {req.args.get('seconds')!r}"))
            return
        cancel = threading.Event()
        try:
            out = await asyncio.to_thread(
                run_bench,
                device,
                python=python,
                seconds=float(seconds),
                floor_tflops=cfg.floor_tflops,
                cancel=cancel,
            )
        except asyncio.CancelledError:
            cancel.set()  # the bench's child is killed, not left to run out its time
            raise
        reply(_done(req, out.ok, describe(out), plan={"device": device}, after=out.as_dict()))

    # ------------------------------------------------------------------ checkpoints

    def _resume_target(self) -> str | None:
        a = self.run.state.attempt
        return a.resume_from if a is not None and a.ended_at is None else None

    async def prune(self, req: p.Request, reply: Reply) -> None:
        pipe = self.pipeline
        keep = argtypes.checked(req.args.get("keep", pipe.keep), 0, 1_000_000, whole=True)
        if keep is None:
            reply(_done(req, False, f"prune: keep must be a whole number >= 0, got {req.args.get('keep')!r}"))
            return
        keep = int(keep)
        include_rejected = bool(req.args.get("include_rejected"))
        protect = [x for x in [*pipe.verifying, self._resume_target()] if x]
        plan = await asyncio.to_thread(
            pruning.plan, pipe.root, keep, protect=protect, include_rejected=include_rejected
        )
        # Records, not strings: the CLI prints them as `prune --root` does, the control room one a line.
        target = {
            "root": plan.root,
            "keep": keep,
            "bytes_to_free": plan.bytes_to_free,
            "delete": [
                {"step": d.step, "path": d.path, "bytes": d.bytes, "kind": d.kind} for d in plan.delete
            ],
            "kept": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.kept],
            "skipped": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.skipped],
        }
        if not req.confirm or req.args.get("dry_run"):
            msg = (
                f"prune {len(plan.delete)} checkpoint(s) under {plan.root}, keeping {keep} verified: "
                f"{fmt_bytes(plan.bytes_to_free)} to free"
            )
            reply(_plan(req, msg, target) if not req.confirm else _done(req, True, msg, plan=target))
            return
        if not self.confirmed(req, reply, target):
            return
        before = {"disk_used_bytes": pipe.usage.used_bytes if pipe.usage else None}
        res = await asyncio.to_thread(pruning.execute, plan, dry_run=False, protect=protect)
        now = time.time()
        # A pruned step directory is the promoted form of a candidate the run knows by its path.
        by_dir = {c.report.promoted_dir: c.path for c in self.run.state.checkpoints if c.report is not None}
        for d in res.deleted:
            self.recorder.emit(
                p.CheckpointState(
                    path=by_dir.get(d.path, d.path), step=d.step, state="pruned", t=now, size_bytes=d.bytes
                )
            )
        usage = await asyncio.to_thread(pipe.disk_sample)
        after = {
            "disk_used_bytes": usage.used_bytes,
            "bytes_freed": res.bytes_freed,
            "deleted": [{"step": d.step, "path": d.path, "bytes": d.bytes} for d in res.deleted],
            "failed": [{"step": f.step, "path": f.path, "why": f.why} for f in res.failed],
        }
        msg = (
            f"pruned {len(res.deleted)} checkpoint(s), freed {fmt_bytes(res.bytes_freed)}, kept {len(res.kept)}"
            + (f"; {len(res.failed)} failed: {res.failed[0].why}" if res.failed else "")
        )
        reply(_done(req, not res.failed, msg, plan=target, before=before, after=after))

    async def verify(self, req: p.Request, reply: Reply) -> None:
        pipe = self.pipeline
        path = req.args.get("path") or str(latest_checkpoint(pipe.root) or "")
        if not path:
            reply(_done(req, False, "verify: no verified checkpoint yet (`latest` points nowhere)"))
            return
        if not req.confirm:
            reply(_plan(req, f"verify {path}", {"path": path}))
            return
        if not self.confirmed(req, reply, {"path": path}):
            return
        reply(p.Reply(id=req.id, action="verify", stage="progress", message=f"verifying {path}"))
        raw = req.args.get("expected")
        try:
            expected = decode_expected(raw) if isinstance(raw, dict) else None
        except ValueError as exc:
            reply(_done(req, False, f"verify: expected {exc}"))
            return
        rep = await asyncio.to_thread(pipe.verify_now, path, expected)
        summary = (
            f"{path}: {'verified' if rep.ok else 'REJECTED: ' + str(rep.reason)}; "
            f"{rep.tensors} tensors, {rep.params} params, "
            f"non-finite {len(rep.nonfinite)}, outliers {len(rep.outliers)}"
        )
        small = _builtins(msgspec.structs.replace(rep, stds={}))
        reply(_done(req, rep.ok, summary, plan={"path": path}, after=small))

    # ------------------------------------------------------------------ resume

    async def _wait_for_verification(self, req: p.Request, reply: Reply) -> list[tuple[str, float]]:
        """A checkpoint saved just before a death may still be in the verifier: wait for it
        (bounded, saying so) rather than resume from an older one or refuse. What is still in
        flight at the bound is returned."""
        deadline = time.monotonic() + RESUME_WAIT_S
        said: set[str] = set()
        while (flight := self.pipeline.in_flight()) and time.monotonic() < deadline:
            new = [path for path, _ in flight if path not in said]
            if new:
                said.update(new)
                reply(
                    p.Reply(
                        id=req.id,
                        action=req.action,
                        stage="progress",
                        message=f"waiting for the verification of {', '.join(new)} (up to {RESUME_WAIT_S:.0f} s)",
                    )
                )
            await asyncio.sleep(0.2)
        return self.pipeline.in_flight()

    async def resume(self, req: p.Request, reply: Reply) -> None:
        still = await self._wait_for_verification(req, reply)
        plan = await self.resumer.plan()
        if still:
            # Refused with what is still being verified: the newest resume point may be among them.
            waiting = ", ".join(f"{path} (for {time.time() - since:.0f} s)" for path, since in still)
            plan.refusals.append(f"still verifying {waiting}: resume again once it has a verdict")
            plan.ok = False
        target = _builtins(plan)
        if not plan.ok:
            reply(_done(req, False, "resume refused: " + "; ".join(plan.refusals), plan=target))
            return
        if not req.confirm:
            note = f"; {plan.note}" if plan.note else ""
            reply(
                _plan(
                    req,
                    f"resume attempt {plan.attempt} from {plan.checkpoint} (step {plan.step}){note}",
                    target,
                )
            )
            return
        if not self.confirmed(req, reply, target):
            return
        result = await self.resumer.start(plan, progress=_progress(reply, req))
        reply(_done(req, result.ok, result.message, plan=target, before=result.before, after=result.after))
