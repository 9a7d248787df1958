"""Actions a client asks the keeper for. Each has a plan (the exact target, shown for
confirmation; `confirm=False` asks for it) and an execution with before/after evidence, and every
outcome — done or refused — is journaled. Blocking work runs in a worker thread; progress lines
go back to the asking client as they happen.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from trainroom.core import protocol as p

if TYPE_CHECKING:
    from trainroom.core.keeper.loop import Keeper

Reply = Callable[[p.Reply], None]
Handler = Callable[["Keeper", p.Request, Reply], Awaitable[None]]

KNOWN = ("kill", "reclaim", "prune", "resume", "dump", "verify", "bench")
DESTRUCTIVE = ("kill", "reclaim", "prune", "resume")


def journal_action(
    keeper: Keeper,
    action: str,
    ok: bool,
    message: str,
    target: dict[str, Any],
    before: dict[str, Any],
    after: dict[str, Any],
    client: str = "",
) -> None:
    keeper.emit(
        p.ActionRecord(
            action=action,
            t=time.time(),
            ok=ok,
            message=message,
            target=target,
            before=before,
            after=after,
            client=client,
        )
    )
    keeper.journal.flush(fsync=True)


class Actions:
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper
        self.handlers: dict[str, Handler] = {
            "kill": kill,
            "reclaim": reclaim,
            "dump": dump,
            "bench": bench,
            "prune": prune,
            "verify": verify,
            "resume": resume,
        }
        self._busy: set[str] = set()

    def register(self, name: str, handler: Handler) -> None:
        self.handlers[name] = handler

    async def serve(self, keeper: Keeper, req: p.Request, reply: Reply, client: str) -> None:
        handler = self.handlers.get(req.action)
        if handler is None:
            known = req.action in KNOWN
            msg = (
                f"{req.action}: not available in this build yet"
                if known
                else f"unknown action {req.action!r} (known: {', '.join(KNOWN)})"
            )
            reply(p.Reply(id=req.id, action=req.action, stage="done", ok=False, message=msg))
            return
        if req.confirm and req.action in self._busy:
            reply(
                p.Reply(
                    id=req.id,
                    action=req.action,
                    stage="done",
                    ok=False,
                    message=f"{req.action} is already running",
                )
            )
            return
        if req.confirm:
            self._busy.add(req.action)
        try:
            await handler(keeper, req, _journaling(keeper, req, reply, client))
        finally:
            if req.confirm:
                self._busy.discard(req.action)


def _journaling(keeper: Keeper, req: p.Request, reply: Reply, client: str) -> Reply:
    """Journal every `done` of a confirmed request (or a refusal of any) as it is sent."""

    def send(r: p.Reply) -> None:
        if r.stage == "done" and (req.confirm or not r.ok):
            journal_action(keeper, r.action, r.ok, r.message, r.plan, r.before, r.after, client)
        reply(r)

    return send


def _progress(reply: Reply, req: p.Request) -> Callable[[str], None]:
    loop = asyncio.get_running_loop()

    def say(line: str) -> None:
        loop.call_soon_threadsafe(
            reply, p.Reply(id=req.id, action=req.action, stage="progress", message=line)
        )

    return say


def _done(req: p.Request, ok: bool, message: str, **kw: Any) -> p.Reply:
    return p.Reply(id=req.id, action=req.action, stage="done", ok=ok, message=message, **kw)


# ------------------------------------------------------------------------------------ kill


async def kill(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ops.kill import execute_kill, plan_kill, run_vram_probe

    a = keeper.state.attempt
    if a is None or a.pid <= 0:
        reply(_done(req, False, "kill: this run has no attempt with a process group to kill"))
        return
    plan = await asyncio.to_thread(
        plan_kill, a.pid, a.pgid, a.start_time, attempt_start_ticks=a.start_ticks, keeper_pid=os.getpid()
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
        reply(p.Reply(id=req.id, action="kill", stage="plan", message=summary, plan=target))
        return
    cfg = keeper.config.kill
    gpu = keeper.gpu_probe()
    probe = run_vram_probe(gpu, sorted({a.pid, *pids})) if gpu is not None else None
    result = await asyncio.to_thread(
        execute_kill,
        plan,
        grace_s=float(req.args.get("grace_s", cfg.grace_s)),
        vram_probe=probe,
        tolerance_bytes=int(cfg.vram_tolerance_mib * (1 << 20)),
        vram_timeout_s=cfg.vram_timeout_s,
        progress=_progress(reply, req),
        vram_poll_s=cfg.vram_poll_s,
    )
    r = result.as_dict()
    reply(
        _done(
            req, result.ok, result.message, plan=target, before=r.get("before", {}), after=r.get("after", {})
        )
    )


# ------------------------------------------------------------------------------------ reclaim


async def reclaim(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ops.reclaim import execute_reclaim, plan_reclaim

    roots = keeper.reclaim_roots()
    plan = await asyncio.to_thread(plan_reclaim, roots["sys_root"], roots["proc_root"])
    target = plan.as_dict()
    if not req.confirm:
        cache = target.get("page_cache_bytes")
        msg = f"reclaim page cache via {plan.method} ({plan.target})" + (
            f": {cache / (1 << 30):.2f} GiB cached now" if isinstance(cache, int) else ""
        )
        reply(p.Reply(id=req.id, action="reclaim", stage="plan", message=msg, plan=target))
        return
    result = await asyncio.to_thread(
        execute_reclaim,
        plan,
        sys_root=roots["sys_root"],
        proc_root=roots["proc_root"],
        progress=_progress(reply, req),
    )
    r = result.as_dict()
    reply(
        _done(
            req, result.ok, result.message, plan=target, before=r.get("before", {}), after=r.get("after", {})
        )
    )


# ------------------------------------------------------------------------------------ dump


async def dump(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ops.stacks import dump_stacks

    a = keeper.state.attempt
    if a is None or a.ended_at is not None or a.pid <= 0:
        reply(_done(req, False, "dump: no live trainer to dump"))
        return
    if not req.confirm:
        how = "SIGUSR1 (faulthandler)" if a.instrumented else "py-spy dump"
        reply(
            p.Reply(
                id=req.id,
                action="dump",
                stage="plan",
                message=f"dump stacks of pid {a.pid} via {how}",
                plan={"pid": a.pid, "method": how},
            )
        )
        return
    out = await asyncio.to_thread(dump_stacks, a.pid, str(keeper.log_path), a.instrumented)
    reply(
        _done(
            req,
            bool(out.get("ok")),
            out.get("message", ""),
            plan={"pid": a.pid},
            after={"method": out.get("method"), "stacks": out.get("text", "")},
        )
    )


# ------------------------------------------------------------------------------------ bench


async def bench(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ops.bench import describe, run_bench

    device = str(req.args.get("device", "auto"))
    python = keeper.trainer_python()
    if not req.confirm:
        reply(
            p.Reply(
                id=req.id,
                action="bench",
                stage="plan",
                message=f"matmul bench on {device} (~1 s)",
                plan={"device": device, "python": python},
            )
        )
        return
    reply(
        p.Reply(id=req.id, action="bench", stage="progress", message=f"running the matmul bench on {device}")
    )
    cfg = keeper.config.bench  # the keeper always holds a Config (defaults when there is no file)
    seconds = float(req.args.get("seconds") or cfg.seconds)
    out = await asyncio.to_thread(
        run_bench, device, python=python, seconds=seconds, floor_tflops=cfg.floor_tflops
    )
    ok = bool(out.get("ok", out.get("tflops") is not None))
    msg = describe(out)
    reply(_done(req, ok, str(msg), plan={"device": device}, after=out))


# ------------------------------------------------------------------------------------ checkpoints


def _pipeline(keeper: Keeper) -> Any:
    return getattr(keeper.watch, "checkpoints", None) if keeper.watch is not None else None


def _resume_target(keeper: Keeper) -> str | None:
    a = keeper.state.attempt
    return a.resume_from if a is not None and a.ended_at is None else None


async def prune(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ops import prune as pruning

    pipe = _pipeline(keeper)
    if pipe is None:
        reply(_done(req, False, "prune: this run has no checkpoint root"))
        return
    keep = int(req.args.get("keep", pipe.keep))
    if keep < 0:
        reply(_done(req, False, "prune: keep must be 0 or more"))
        return
    include_rejected = bool(req.args.get("include_rejected"))
    protect = [x for x in [*pipe.verifying, _resume_target(keeper)] if x]
    plan = await asyncio.to_thread(
        pruning.plan, pipe.root, keep, protect=protect, include_rejected=include_rejected
    )
    # Records, not strings: the CLI prints them as `prune --root` does, the control room one a line.
    target = {
        "root": plan.root,
        "keep": keep,
        "bytes_to_free": plan.bytes_to_free,
        "delete": [{"step": d.step, "path": d.path, "bytes": d.bytes, "kind": d.kind} for d in plan.delete],
        "kept": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.kept],
        "skipped": [{"step": k.step, "path": k.path, "why": k.why} for k in plan.skipped],
    }
    if not req.confirm or req.args.get("dry_run"):
        msg = (
            f"prune {len(plan.delete)} checkpoint(s) under {plan.root}, keeping {keep} verified: "
            f"{plan.bytes_to_free / (1 << 20):.1f} MiB to free"
        )
        stage = "plan" if not req.confirm else "done"
        reply(p.Reply(id=req.id, action="prune", stage=stage, ok=True, message=msg, plan=target))
        return
    before = {"disk_used_bytes": pipe.usage.used_bytes if pipe.usage else None}
    res = await asyncio.to_thread(pruning.execute, plan, dry_run=False, protect=protect)
    now = time.time()
    # A pruned step directory is the promoted form of a candidate the run knows by its path.
    by_dir = {(c.report or {}).get("promoted_dir"): c.path for c in keeper.state.checkpoints}
    for d in res.deleted:
        keeper.emit(
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
    ok = not res.failed
    msg = (
        f"pruned {len(res.deleted)} checkpoint(s), freed {res.bytes_freed / (1 << 20):.1f} MiB, "
        f"kept {len(res.kept)}" + (f"; {len(res.failed)} failed: {res.failed[0].why}" if res.failed else "")
    )
    reply(_done(req, ok, msg, plan=target, before=before, after=after))


async def verify(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.ckpt.layout import latest_checkpoint
    from trainroom.core.ckpt.verify import verify_in_subprocess

    pipe = _pipeline(keeper)
    path = req.args.get("path") or (str(latest_checkpoint(pipe.root) or "") if pipe is not None else "")
    if not path:
        reply(_done(req, False, "verify: no verified checkpoint yet (`latest` points nowhere)"))
        return
    if not req.confirm:
        reply(
            p.Reply(id=req.id, action="verify", stage="plan", message=f"verify {path}", plan={"path": path})
        )
        return
    reply(p.Reply(id=req.id, action="verify", stage="progress", message=f"verifying {path}"))
    # The pipeline's warm verifier (torch already imported) when there is one.
    check = pipe.verify_now if pipe is not None else verify_in_subprocess
    expected = req.args.get("expected")
    rep = await asyncio.to_thread(check, path, expected if isinstance(expected, dict) else None)
    summary = (
        f"{path}: {'verified' if rep.get('ok') else 'REJECTED: ' + str(rep.get('reason'))}; "
        f"{rep.get('tensors')} tensors, {rep.get('params')} params, "
        f"non-finite {len(rep.get('nonfinite') or {})}, outliers {len(rep.get('outliers') or [])}"
    )
    small = {k: v for k, v in rep.items() if k not in ("stds",)}
    reply(_done(req, bool(rep.get("ok")), summary, plan={"path": path}, after=small))


# ------------------------------------------------------------------------------------ resume


async def resume(keeper: Keeper, req: p.Request, reply: Reply) -> None:
    from trainroom.core.keeper.recovery import plan_resume, start_resume

    plan = await plan_resume(keeper)
    if not plan["ok"]:
        reply(_done(req, False, "resume refused: " + "; ".join(plan["refusals"]), plan=plan))
        return
    if not req.confirm:
        reply(
            p.Reply(
                id=req.id,
                action="resume",
                stage="plan",
                plan=plan,
                message=f"resume attempt {plan['attempt']} from {plan['checkpoint']} (step {plan['step']})",
            )
        )
        return
    result = await start_resume(keeper, plan, progress=_progress(reply, req))
    reply(
        _done(
            req,
            result["ok"],
            result["message"],
            plan=plan,
            before=result.get("before", {}),
            after=result.get("after", {}),
        )
    )
