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
from typing import Any

import msgspec

from trainroom.core import argtypes
from trainroom.core import protocol as p
from trainroom.core.ckpt.layout import latest_checkpoint
from trainroom.core.ckpt.report import decode_expected
from trainroom.core.findings import ACTIONS
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.keeper.recovery import Resumer, watched_target
from trainroom.core.keeper.replies import (
    Handler,
    Reply,
    as_builtins,
    done_reply,
    narrowed,
    plan_reply,
    progress_to,
    prune_target,
    result_reply,
    target_of,
    what_changed,
)
from trainroom.core.ops import flight
from trainroom.core.ops import prune as pruning
from trainroom.core.ops.bench import describe, run_bench
from trainroom.core.ops.kill import KILL_CONFIRM_S, KillPlan, execute_kill, plan_kill
from trainroom.core.ops.members import Lifetime
from trainroom.core.ops.reclaim import execute_reclaim, plan_reclaim
from trainroom.core.ops.stacks import dump_stacks
from trainroom.core.ops.target_kill import plan_target_kill
from trainroom.core.ops.vram import run_vram_probe
from trainroom.core.ops.wake import execute_wake, plan_wake
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.run.state import AttemptView
from trainroom.core.units import fmt_bytes

RESUME_WAIT_S = 120.0
# After a kill's grace and confirmation, how long its target's end still counts as "stopped".
STOP_MARGIN_S = 10.0
# Long, and safe to stop midway (a kill or a prune is never cut off half-way).
CANCELLABLE = ("bench", "verify", "dump", "resume")

KNOWN = tuple(a.name for a in ACTIONS)


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
        self._clients: dict[int, str] = {}  # request id -> the client that sent it (journaled)
        self._running: dict[str, asyncio.Task[None]] = {}  # action -> the task carrying it out

    def confirmed(self, req: p.Request, reply: Reply, plan: dict[str, Any]) -> bool:
        """False (and a refusal sent) when a confirmed request's plan is not the one to run."""
        expect = req.args.get("expect")
        if not isinstance(expect, dict):
            reply(
                done_reply(
                    req, False, f"{req.action}: confirm with the plan you confirmed (args.expect)", plan=plan
                )
            )
            return False
        was, now = target_of(req.action, expect), target_of(req.action, plan)
        if was != now and not narrowed(req.action, was, now):
            reply(
                done_reply(
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
            reply(done_reply(req, False, msg))
            return
        if req.confirm and req.action in self._busy:
            reply(done_reply(req, False, f"{req.action} is already running"))
            return
        if req.confirm:
            self._busy.add(req.action)
        send = self._journaling(req, reply, client)
        self._clients[id(req)] = client
        task = asyncio.current_task()
        if req.confirm and task is not None and req.action in CANCELLABLE:
            self._running[req.action] = task
        try:
            await handler(req, send)
        except asyncio.CancelledError:
            send(done_reply(req, False, f"{req.action} cancelled by a client before it finished"))
        finally:
            self._clients.pop(id(req), None)
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

    # ------------------------------------------------------------------ kill

    async def kill(self, req: p.Request, reply: Reply) -> None:
        """The trainer's kill (its process group), or, with args {"finding": IDENT}, the kill of
        what that finding targets (a duplicate trainer, a lock holder, leftovers)."""
        ident = req.args.get("finding")
        if ident is not None:
            await self._kill_target(req, reply, ident)
        else:
            await self._kill_trainer(req, reply)

    async def _kill_trainer(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.pid <= 0:
            reply(done_reply(req, False, "kill: this run has no attempt with a process group to kill"))
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
            workers=self.run.state.attempt_workers(),
        )
        pids = [m.pid for m in plan.members]
        if plan.nothing_left:
            # The attempt died whole (a SIGKILL of the group): nothing to signal, but a kill still
            # confirms the driver gave its memory back before anyone resumes.
            summary = (
                f"nothing left to kill of attempt {a.n}: process group {plan.pgid} has no live members; "
                "confirm the driver released its memory"
            )
        else:
            summary = f"kill process group {plan.pgid} of attempt {a.n}: {len(pids)} process(es) {pids}"
        await self._carry_out_kill(req, reply, plan, summary, sorted({a.pid, *pids}), stopping=a)

    async def _kill_target(self, req: p.Request, reply: Reply, ident: object) -> None:
        f = self.run.state.findings.get(ident) if isinstance(ident, str) else None
        if f is None:
            reply(done_reply(req, False, f"kill: finding {ident!r} is not open (it cleared, or never was)"))
            return
        if f.action != "kill":
            reply(
                done_reply(
                    req, False, f"kill: finding {f.ident} offers no kill (its action: {f.action or 'none'})"
                )
            )
            return
        if f.target is None:
            await self._kill_trainer(req, reply)  # the finding's kill is the trainer's own
            return
        plan = await asyncio.to_thread(
            plan_target_kill,
            f.target,
            keeper_pid=os.getpid(),
            run_id=self.run.run_id,
            live_trainer=self._live_trainer(),
        )
        pids = [m.pid for m in plan.members]
        if plan.nothing_left:
            summary = (
                f"nothing left to kill of {plan.subject} ({f.ident}); confirm the driver released its memory"
            )
        else:
            summary = f"kill {plan.subject} ({f.ident}): {len(pids)} process(es) {pids}"
        await self._carry_out_kill(
            req, reply, plan, summary, sorted(set(pids) | set(f.target.pids)), finding=f.ident
        )

    def _live_trainer(self) -> set[int]:
        """The live attempt's processes (never a targeted kill's target)."""
        st = self.run.state
        a = st.attempt
        if a is None or not a.alive:
            return set()
        procs = st.probe.procs if st.probe is not None else None
        return {a.pid, *(procs.states if procs is not None else {})}

    async def _carry_out_kill(
        self,
        req: p.Request,
        reply: Reply,
        plan: KillPlan,
        summary: str,
        vram_pids: list[int],
        *,
        stopping: AttemptView | None = None,
        finding: str | None = None,
    ) -> None:
        """Plan -> confirm -> execute, the same for the trainer's kill and a targeted one."""
        target = plan.as_dict() | ({"finding": finding} if finding else {})
        if not plan.ok and not plan.nothing_left:
            reply(done_reply(req, False, "kill refused: " + "; ".join(plan.refusals), plan=target))
            return
        if not req.confirm:
            reply(plan_reply(req, summary, target))
            return
        if not self.confirmed(req, reply, target):
            return
        cfg = self.run.settings.kill
        grace = argtypes.checked(req.args.get("grace_s", cfg.grace_s), 0, 3600)
        if grace is None:
            reply(
                done_reply(
                    req, False, f"kill: grace_s must be seconds in [0, 3600], got {req.args.get('grace_s')!r}"
                )
            )
            return
        if stopping is not None and stopping.alive and plan.members:
            # Journaled before the first signal: the end this causes is "stopped", not a death.
            now = time.time()
            until = now + float(grace) + KILL_CONFIRM_S + STOP_MARGIN_S
            self.recorder.emit(
                p.AttemptStopping(n=stopping.n, t=now, by=self._clients.get(id(req), "a client"), until=until)
            )
            self.recorder.flush(fsync=True)
        result = await asyncio.to_thread(
            execute_kill,
            plan,
            grace_s=float(grace),
            vram_probe=run_vram_probe(self.gpu, vram_pids),
            tolerance_bytes=cfg.vram_tolerance_bytes,
            vram_timeout_s=cfg.vram_timeout_s,
            progress=progress_to(reply, req),
            vram_poll_s=cfg.vram_poll_s,
        )
        reply(result_reply(req, result.ok, result.message, target, result.as_dict()))

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
            reply(plan_reply(req, msg, target))
            return
        if not self.confirmed(req, reply, target):
            return
        result = await asyncio.to_thread(
            execute_reclaim,
            plan,
            sys_root=roots.cgroup,
            proc_root=roots.proc,
            progress=progress_to(reply, req),
        )
        reply(result_reply(req, result.ok, result.message, target, result.as_dict()))

    # ------------------------------------------------------------------ dump

    async def dump(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.ended_at is not None or a.pid <= 0:
            reply(done_reply(req, False, "dump: no live trainer to dump"))
            return
        # One rank's process: the rank asked for (a job's hung-collective report: the pid its
        # reporter proved by SO_PEERCRED at hello, while connected), else the rank a HUNG names (a
        # torchrun worker), else the attempt's own process.
        pid, instrumented, who = a.pid, a.instrumented, f"pid {a.pid}"
        if (hung := self.run.state.hung_worker()) is not None:
            pid, who = hung, f"pid {hung}"
        rank = req.args.get("rank")
        if rank is not None:
            r = self.run.state.ranks.get(rank) if isinstance(rank, int) else None
            if r is None or r.attempt != a.n or r.pid is None or not r.connected:
                reply(done_reply(req, False, f"dump: rank {rank} has no connected reporter in attempt {a.n}"))
                return
            pid, instrumented, who = r.pid, True, f"rank {rank} (pid {r.pid})"
        if not req.confirm:
            stopped = self.run.state.status == "hung" and "stopped" in self.run.state.status_reason
            how = (
                "py-spy (stopped: read without pausing)"
                if stopped or not instrumented
                else "SIGUSR1 (faulthandler)"
            )
            reply(plan_reply(req, f"dump stacks of {who} via {how}", {"pid": pid, "method": how}))
            return
        if not self.confirmed(req, reply, {"pid": pid}):
            return
        out = await asyncio.to_thread(dump_stacks, pid, str(self.run.log_path), instrumented)
        after: dict[str, Any] = {"method": out.method, "stacks": out.text}
        if isinstance(rank, int):
            after["flight_recorder"] = as_builtins(await asyncio.to_thread(flight.trigger, pid, rank))
        reply(done_reply(req, out.ok, out.message, plan={"pid": pid}, after=after))

    # ------------------------------------------------------------------ continue

    async def wake(self, req: p.Request, reply: Reply) -> None:
        a = self.run.state.attempt
        if a is None or a.ended_at is not None or a.pid <= 0:
            reply(done_reply(req, False, "continue: no live trainer to continue"))
            return
        life = Lifetime(run_id=self.run.run_id, start_time=a.start_time, start_ticks=a.start_ticks)
        plan = await asyncio.to_thread(plan_wake, a.pgid, life, self.run.state.attempt_workers())
        target = {"pgid": plan.pgid, "members": [as_builtins(m) for m in plan.stopped]}
        if not plan.ok:
            reply(done_reply(req, False, "continue: " + "; ".join(plan.refusals), plan=target))
            return
        pids = [m.pid for m in plan.stopped]
        if not req.confirm:
            reply(
                plan_reply(req, f"SIGCONT {len(pids)} stopped process(es) of attempt {a.n}: {pids}", target)
            )
            return
        if not self.confirmed(req, reply, target):
            return
        result = await asyncio.to_thread(execute_wake, plan)
        reply(done_reply(req, result.ok, result.message, plan=target, after=as_builtins(result)))

    # ------------------------------------------------------------------ bench

    async def bench(self, req: p.Request, reply: Reply) -> None:
        device = str(req.args.get("device", "auto"))
        python = self.run.trainer_python()
        if not req.confirm:
            reply(plan_reply(req, f"matmul bench on {device} (~1 s)", {"device": device, "python": python}))
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
            reply(
                done_reply(req, False, f"bench: seconds must be in (0, 60], got {req.args.get('seconds')!r}")
            )
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
        reply(done_reply(req, out.ok, describe(out), plan={"device": device}, after=out.as_dict()))

    # ------------------------------------------------------------------ checkpoints

    def _resume_target(self) -> str | None:
        a = self.run.state.attempt
        return a.resume_from if a is not None and a.ended_at is None else None

    async def prune(self, req: p.Request, reply: Reply) -> None:
        pipe = self.pipeline
        keep = argtypes.checked(req.args.get("keep", pipe.keep), 0, 1_000_000, whole=True)
        if keep is None:
            reply(
                done_reply(
                    req, False, f"prune: keep must be a whole number >= 0, got {req.args.get('keep')!r}"
                )
            )
            return
        keep = int(keep)
        include_rejected = bool(req.args.get("include_rejected"))
        protect = [x for x in [*pipe.verifying, self._resume_target()] if x]
        plan = await asyncio.to_thread(
            pruning.plan, pipe.root, keep, protect=protect, include_rejected=include_rejected
        )
        target = prune_target(plan, keep)
        if not req.confirm or req.args.get("dry_run"):
            msg = (
                f"prune {len(plan.delete)} checkpoint(s) under {plan.root}, keeping {keep} verified: "
                f"{fmt_bytes(plan.bytes_to_free)} to free"
            )
            reply(
                plan_reply(req, msg, target) if not req.confirm else done_reply(req, True, msg, plan=target)
            )
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
        reply(done_reply(req, not res.failed, msg, plan=target, before=before, after=after))

    async def verify(self, req: p.Request, reply: Reply) -> None:
        pipe = self.pipeline
        # `latest` under the root, else the newest verified checkpoint the watch has seen.
        watched = watched_target(pipe)
        path = (
            req.args.get("path")
            or str(latest_checkpoint(pipe.root) or "")
            or (watched.path if watched else "")
        )
        if not path:
            reply(done_reply(req, False, "verify: no verified checkpoint yet (`latest` points nowhere)"))
            return
        if not req.confirm:
            reply(plan_reply(req, f"verify {path}", {"path": path}))
            return
        if not self.confirmed(req, reply, {"path": path}):
            return
        reply(p.Reply(id=req.id, action="verify", stage="progress", message=f"verifying {path}"))
        raw = req.args.get("expected")
        try:
            expected = decode_expected(raw) if isinstance(raw, dict) else None
        except ValueError as exc:
            reply(done_reply(req, False, f"verify: expected {exc}"))
            return
        rep = await asyncio.to_thread(pipe.verify_now, path, expected)
        summary = (
            f"{path}: {'verified' if rep.ok else 'REJECTED: ' + str(rep.reason)}; "
            f"{rep.tensors} tensors, {rep.params} params, "
            f"non-finite {len(rep.nonfinite)}, outliers {len(rep.outliers)}"
        )
        small = as_builtins(msgspec.structs.replace(rep, stds={}))
        reply(done_reply(req, rep.ok, summary, plan={"path": path}, after=small))

    # ------------------------------------------------------------------ resume

    async def resume(self, req: p.Request, reply: Reply) -> None:
        still = await self.pipeline.wait_in_flight(RESUME_WAIT_S, progress_to(reply, req))
        plan = await self.resumer.plan()
        if still:
            # Refused with what is still being verified: the newest resume point may be among them.
            waiting = ", ".join(f"{path} (for {time.time() - since:.0f} s)" for path, since in still)
            plan.refusals.append(f"still verifying {waiting}: resume again once it has a verdict")
            plan.ok = False
        target = as_builtins(plan)
        if not plan.ok:
            reply(done_reply(req, False, "resume refused: " + "; ".join(plan.refusals), plan=target))
            return
        if not req.confirm:
            note = f"; {plan.note}" if plan.note else ""
            reply(
                plan_reply(
                    req,
                    f"resume attempt {plan.attempt} from {plan.checkpoint} (step {plan.step}){note}",
                    target,
                )
            )
            return
        if not self.confirmed(req, reply, target):
            return
        result = await self.resumer.start(plan, progress=progress_to(reply, req))
        reply(
            done_reply(req, result.ok, result.message, plan=target, before=result.before, after=result.after)
        )
