"""Resume and auto-resume: a new attempt under the same keeper and run id, from the `latest`
verified checkpoint, only when the death criteria hold — the old process group is gone, no lock
file is held, the driver gave the memory back, and the host has the RAM the load needs.

The checkpoint reaches the trainer as TRAINROOM_RESUME and through the resume command template
(`{ckpt}`, `{ckpt_dir}`, `{step}`, `{run_id}`); the new attempt's argv is what its requested LR
is parsed from, so LR_MISMATCH compares against this session's policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainroom.core import protocol as p
from trainroom.core.config import resume_argv

if TYPE_CHECKING:
    from trainroom.core.keeper.loop import Keeper


def _members(pgid: int, start_time: float, start_ticks: int | None) -> list[int]:
    from trainroom.core.ops.kill import live_members

    # By start time too: a stranger that reused the group number is not the old attempt.
    return live_members(pgid, start_time, start_ticks)


def _watched_target(pipe: Any) -> dict[str, Any] | None:
    """The newest watched file (an uninstrumented trainer's out/ckpt.pt) whose current version
    verified: nanoGPT resumes from the file it overwrites, so that file is the resume target
    while its bytes are the ones that verified (a rewrite sends it back to settling)."""
    best: dict[str, Any] | None = None
    for f in getattr(getattr(pipe, "watch_state", None), "files", {}).values():
        if f.state != "verified" or not Path(f.path).is_file():
            continue
        if best is None or (f.step or -1) > (best["step"] or -1):
            best = {"path": f.path, "step": f.step, "digest": f.digest}
    return best


def _held_locks(paths: list[str]) -> list[str]:
    from trainroom.core.probes.locks import lock_holders

    out = []
    for lk in lock_holders(paths):
        if not lk.held:
            continue
        live = [h for h in lk.holders if not h.gone]
        gone = [h for h in lk.holders if h.gone]
        # /proc/locks names the pid that took the lock; when that one is gone, the holder is
        # whoever inherited the descriptor (the seed's orphan child).
        who = [f"pid {h.pid} ({h.state or '?'})" for h in live + lk.inheritors]
        text = f"lock {lk.path} is held by {', '.join(who) if who else 'a process not visible here'}"
        if gone:
            dead = ", ".join(f"pid {h.pid} ({'a zombie' if h.exists else 'gone'})" for h in gone)
            text += f" through a descriptor taken by {dead}"
        out.append(text)
    return out


def _driver_bytes(keeper: Keeper, pids: list[int]) -> int | None:
    gpu = keeper.gpu_probe()
    if gpu is None:
        return None
    from trainroom.core.ops.kill import run_vram_probe

    try:
        return run_vram_probe(gpu, pids)()
    except Exception:
        return None


def _plan_sync(keeper: Keeper) -> dict[str, Any]:
    from trainroom.core.ckpt.layout import latest_checkpoint
    from trainroom.core.ckpt.verify import load_need_bytes
    from trainroom.core.health.host import host_ram_low
    from trainroom.core.probes.host import read_meminfo

    st = keeper.state
    a = st.attempt
    refusals: list[str] = []
    plan: dict[str, Any] = {"ok": False, "refusals": refusals, "attempt": (a.n + 1) if a else 1}
    if a is None:
        refusals.append("this run has no attempt yet")
        return plan
    if a.ended_at is None:
        refusals.append(f"attempt {a.n} (pid {a.pid}) is still running: kill it first (k)")
    live = _members(a.pgid, a.start_time, a.start_ticks)
    if live:
        refusals.append(
            f"{len(live)} process(es) of attempt {a.n} still live in group {a.pgid}: {live} "
            "(kill clears them)"
        )
    refusals += _held_locks(keeper.lock_files())
    cfg = keeper.config
    tolerance = int(cfg.kill.vram_tolerance_mib * (1 << 20))
    held = _driver_bytes(keeper, [a.pid])
    plan["driver_bytes"] = held
    if held is not None and held > tolerance:
        refusals.append(
            f"the driver still holds {held / (1 << 20):.0f} MiB for the old attempt "
            f"(tolerance {tolerance / (1 << 20):.0f} MiB): kill and wait for it to fall"
        )
    pipe = getattr(keeper.watch, "checkpoints", None) if keeper.watch is not None else None
    ckpt = latest_checkpoint(pipe.root) if pipe is not None else None
    step = None
    if ckpt is not None:
        verified = st.last_verified()
        for c in st.checkpoints:
            promoted = (c.report or {}).get("promoted_file")
            if c.state == "verified" and promoted and Path(promoted) == Path(ckpt):
                step = c.step
        if step is None:
            try:
                import json

                step = json.loads((Path(ckpt).parent / "manifest.json").read_text()).get("step")
            except (OSError, ValueError):
                step = None
        if step is None and verified is not None:
            step = verified.step
    watched = _watched_target(pipe) if pipe is not None else None
    if watched is not None and (ckpt is None or (watched["step"] or -1) > (step if step is not None else -1)):
        ckpt, step = Path(watched["path"]), watched["step"]
        plan["digest"] = watched["digest"]  # checked again before the load: no sidecar records it
    if ckpt is None:
        refusals.append("no verified checkpoint: `latest` points nowhere")
    else:
        plan["checkpoint"] = str(ckpt)
        plan["step"] = step
        size = Path(ckpt).stat().st_size
        mem = read_meminfo().get("MemAvailable")
        low = host_ram_low(
            mem, load_need_bytes(size), str(ckpt), floor_bytes=cfg.thresholds.host_ram_low_bytes
        )
        if low is not None:
            refusals.append(f"{low.message} — reclaim the page cache first (c)")
        plan["mem_available_bytes"] = mem
        plan["checkpoint_bytes"] = size
    template = keeper.options.get("resume_template") or cfg.resume.command
    if "checkpoint" in plan:
        plan["argv"] = (
            resume_argv(template, ckpt=plan["checkpoint"], step=plan.get("step"), run_id=keeper.record.run_id)
            if template
            else list(keeper.record.argv)
        )
    plan["died_at_step"] = a.last_step
    if a.last_step is not None and plan.get("step") is not None:
        plan["steps_lost"] = max(0, a.last_step - int(plan["step"]))
    plan["ok"] = not refusals
    return plan


async def plan_resume(keeper: Keeper) -> dict[str, Any]:
    return await asyncio.to_thread(_plan_sync, keeper)


async def start_resume(
    keeper: Keeper,
    plan: dict[str, Any],
    progress: Callable[[str], None] | None = None,
    verify_digest: bool = True,
) -> dict[str, Any]:
    from trainroom.core.ckpt.verify import verify_in_subprocess

    say = progress or (lambda _line: None)
    ckpt = plan["checkpoint"]
    if verify_digest:
        say(f"re-verifying {ckpt} (digest, tensors) before the load")
        expected = {"digest": plan["digest"]} if plan.get("digest") else None
        # The pipeline's warm verifier (torch already imported) when there is one.
        pipe = getattr(keeper.watch, "checkpoints", None) if keeper.watch is not None else None
        check = pipe.verify_now if pipe is not None else verify_in_subprocess
        rep = await asyncio.to_thread(check, ckpt, expected)
        if not rep.get("ok"):
            return {"ok": False, "message": f"resume refused: {ckpt} no longer verifies: {rep.get('reason')}"}
    a = keeper.state.attempt
    before = {
        "attempt": a.n if a else None,
        "died_at_step": plan.get("died_at_step"),
        "exit_code": a.exit_code if a else None,
        "exit_signal": a.exit_signal if a else None,
    }
    say(f"starting attempt {plan['attempt']}: {' '.join(plan['argv'])}")
    started = await keeper.start_attempt(plan["argv"], resume_from=ckpt)
    if isinstance(started, p.AttemptEnded):
        return {"ok": False, "message": f"resume failed: {started.error}", "before": before}
    after = {
        "attempt": started.n,
        "pid": started.pid,
        "pgid": started.pgid,
        "from_step": plan.get("step"),
        "steps_lost": plan.get("steps_lost"),
    }
    return {
        "ok": True,
        "before": before,
        "after": after,
        "message": f"attempt {started.n} started (pid {started.pid}) from step {plan.get('step')} of {ckpt}",
    }


class AutoResume:
    """`launch --auto-resume N`: resume by itself, at most N times, with backoff, only when the
    death criteria hold; stop at REPEAT_DEATH (two deaths in one step region). Never relaunches
    into a zombie: a live member or a held lock keeps it waiting, then it gives up and says why."""

    def __init__(self, keeper: Keeper, max_resumes: int) -> None:
        self.keeper = keeper
        self.max = max_resumes
        self.done = 0
        self.stopped: str | None = None

    def _note(self, message: str, kind: str = "auto-resume") -> None:
        self.keeper.emit(p.KeeperNote(t=time.time(), message=message, kind=kind))
        self.keeper.journal.flush()

    async def attempt_ended(self, ended: p.AttemptEnded) -> None:
        from trainroom.core.health.watchdog import repeat_death

        if (ended.exit_code == 0 and ended.exit_signal is None) or self.stopped:
            return
        if ended.error is not None:
            self.stopped = f"the command could not start: {ended.error}"
            self._note(f"auto-resume stopped: {self.stopped}")
            return
        if self.done >= self.max:
            self.stopped = f"{self.max} automatic resume(s) used"
            self._note(f"auto-resume stopped: {self.stopped}")
            return
        k = self.keeper
        rd = repeat_death(k.state, k.watch.thresholds) if k.watch is not None else None
        if rd is not None:
            self.stopped = "REPEAT_DEATH: " + rd.message
            self._note(f"auto-resume stopped: {self.stopped}")
            return
        delay = k.config.auto_resume.delay_s(self.done + 1)
        delay = float(k.options.get("auto_resume_delay_s", delay))
        checks = 0
        waited_for: set[str] = set()
        self._note(f"auto-resume {self.done + 1}/{self.max}: checking the death criteria in {delay:.0f} s")
        while checks < 3:
            await asyncio.sleep(delay)
            a = k.state.attempt
            if a is None or a.n != ended.n:
                return  # somebody resumed by hand meanwhile
            verifying = sorted(getattr(getattr(k.watch, "checkpoints", None), "verifying", None) or ())
            if verifying:
                # A checkpoint saved just before the death is still being verified: it may be the
                # newest resume point, and waiting for it is not a failed check (the verifier has
                # its own timeout).
                if not waited_for.issuperset(verifying):
                    waited_for.update(verifying)
                    self._note(f"auto-resume waits for the verification of {', '.join(verifying)}")
                continue
            plan = await plan_resume(k)
            if plan["ok"]:
                self.done += 1
                result = await start_resume(k, plan)
                self._note(f"auto-resume {self.done}/{self.max}: {result['message']}")
                return
            checks += 1
            self._note("auto-resume waits: " + "; ".join(plan["refusals"]))
            delay = min(delay * 2, k.config.auto_resume.backoff_max_s)
        self.stopped = "the death criteria did not hold after 3 checks"
        self._note(f"auto-resume stopped: {self.stopped}")
