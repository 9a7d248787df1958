"""Resume and auto-resume on the keeper's side: gather what the plan needs (ops.resume decides),
re-verify the checkpoint, start the new attempt under the same keeper and run id.

`launch --auto-resume N` resumes by itself, at most N times, with backoff, only when the death
criteria hold, and stops at REPEAT_DEATH (two deaths in one step region): it never relaunches into
a zombie (a live member or a held lock keeps it waiting, then it gives up and says why).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from trainroom.core.actions.resume import sick_gpu
from trainroom.core.ckpt.layout import QUARANTINE, CheckpointError
from trainroom.core.ckpt.promote import restore_copy, set_aside
from trainroom.core.ckpt.report import Expected
from trainroom.core.configuration.config import Thresholds
from trainroom.core.health.crash import repeat_death
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.ops.resume import ResumeInputs, ResumePlan, WatchedTarget, fall_back, plan_resume
from trainroom.core.ops.vram import read_vram, run_vram_probe
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.wire import protocol as p

Progress = Callable[[str], None]


class ResumeResult(msgspec.Struct, kw_only=True):
    ok: bool
    message: str
    before: dict[str, object] = {}
    after: dict[str, object] = {}


def watched_target(pipe: CheckpointPipeline) -> WatchedTarget | None:
    """The watched checkpoint (a file or a checkpoint directory) with the highest step whose
    current version verified and still exists; among equal (or unknown) steps, the newest."""
    best: WatchedTarget | None = None
    best_key: tuple[int, int] | None = None
    for f in pipe.watch_state.files.values():
        if f.state != "verified" or not Path(f.path).exists():
            continue
        key = (f.step if f.step is not None else -1, f.mtime_ns)
        if best_key is None or key > best_key:
            best, best_key = WatchedTarget(path=f.path, step=f.step, digest=f.digest), key
    return best


class Resumer:
    """Plans and starts resumes for the `resume` action and for auto-resume."""

    def __init__(self, run: RunContext, pipeline: CheckpointPipeline, gpu: GpuProbe) -> None:
        self.run = run
        self.pipeline = pipeline
        self.gpu = gpu
        # The newest verified checkpoint of the job's other runs, when a requeued Slurm job's
        # launch found one (keeper/requeue.py): a resume of this task takes it when newer.
        self.job_best: WatchedTarget | None = None

    def _driver_bytes(self, pids: list[int]) -> int | None:
        try:
            a = self.run.state.attempt
            return read_vram(run_vram_probe(self.gpu, pids, floor=a.vram_floor if a is not None else None))
        except Exception:  # the driver view is advisory here: unavailable is not a refusal
            return None

    def inputs(self) -> ResumeInputs:
        s = self.run.settings
        return ResumeInputs(
            run_id=self.run.run_id,
            argv=list(self.run.argv),
            template=s.resume_template,
            template_from=s.resume_template_from,
            template_hint=s.recognised.note if s.recognised is not None else None,
            lock_files=s.lock_files,
            ckpt_root=str(self.pipeline.root),
            watched=watched_target(self.pipeline),
            vram_tolerance_bytes=s.kill.vram_tolerance_bytes,
            host_ram_floor_bytes=s.thresholds.host_ram_low_bytes,
            job_best=self.job_best,
        )

    async def plan(self) -> ResumePlan:
        inputs = self.inputs()
        return await asyncio.to_thread(plan_resume, self.run.state, inputs, self._driver_bytes)

    def _rejected_own(self, keep: str) -> list[str]:
        """Rejected checkpoints the trainer keeps itself (watched, or announced outside
        quarantine) that are still there: its own resume logic may pick them up."""
        pipe = self.pipeline
        paths = [f.path for f in pipe.watch_state.files.values() if f.state == "rejected"]
        paths += [x for x in pipe.reports if Path(x).parent.name != QUARANTINE]
        root = str(pipe.root).rstrip("/") + "/"
        return [x for x in dict.fromkeys(paths) if x != keep and not x.startswith(root) and Path(x).exists()]

    def _clear_the_way(self, plan: ResumePlan) -> list[tuple[str, str]]:
        """Worker thread: rejected checkpoints moved aside, the trainer's own path restored from
        its verified copy. (path, what was done) for each, journaled by the caller."""
        assert plan.checkpoint is not None
        done = [(x, f"moved aside to {set_aside(x)}") for x in self._rejected_own(plan.checkpoint)]
        if plan.restore_from is not None:
            done.append((plan.checkpoint, restore_copy(plan.restore_from, plan.checkpoint, plan.digest)))
        return done

    async def _ready(self, plan: ResumePlan, say: Progress) -> str | None:
        """Clear the way and re-verify the plan's checkpoint; why it cannot be loaded, or None."""
        ckpt = plan.checkpoint
        assert ckpt is not None
        try:
            done = await asyncio.to_thread(self._clear_the_way, plan)
        except (OSError, CheckpointError) as exc:
            return f"could not prepare {ckpt}: {exc}"
        for path, what in done:
            say(f"{path}: {what}")
            self.pipeline.recorder.note(f"resume: {path}: {what}", kind="resume")
            c = self.run.state.checkpoint(path)
            if c is not None and c.state == "rejected":
                self.pipeline.recorder.emit(
                    p.CheckpointState(
                        path=path,
                        step=c.step,
                        state="rejected",
                        t=time.time(),
                        reason=f"{c.reason or 'rejected'}; {what}",
                        size_bytes=c.size_bytes,
                        digest=c.digest,
                        report=c.report,
                    )
                )
        say(f"re-verifying {ckpt} (digest, tensors) before the load")
        expected = Expected(digest=plan.digest) if plan.digest else None
        rep = await asyncio.to_thread(self.pipeline.verify_now, ckpt, expected)
        return None if rep.ok else f"{ckpt} no longer verifies: {rep.reason}"

    async def start(self, plan: ResumePlan, progress: Progress | None = None) -> ResumeResult:
        say = progress or (lambda _line: None)
        assert plan.checkpoint is not None, "start() takes a plan that found a checkpoint"
        failed: set[str] = set()
        while (why := await self._ready(plan, say)) is not None:
            failed.add(plan.restore_from or plan.checkpoint or "")
            nxt = await asyncio.to_thread(fall_back, plan, self.run.state, self.inputs(), failed)
            if nxt is None:
                return ResumeResult(ok=False, message=f"resume refused: {why}")
            say(f"{why}: falling back to {nxt.checkpoint} (step {nxt.step})")
            self.pipeline.recorder.note(f"resume: {why}: falling back to {nxt.checkpoint}", kind="resume")
            plan = nxt
        ckpt = plan.checkpoint
        assert ckpt is not None
        a = self.run.state.attempt
        before: dict[str, object] = {
            "attempt": a.n if a else None,
            "died_at_step": plan.died_at_step,
            "exit_code": a.exit_code if a else None,
            "exit_signal": a.exit_signal if a else None,
        }
        say(f"starting attempt {plan.attempt}: {' '.join(plan.argv)}")
        started = await self.run.start_attempt(plan.argv, resume_from=ckpt, resume_step=plan.step)
        if isinstance(started, p.AttemptEnded):
            return ResumeResult(ok=False, message=f"resume failed: {started.error}", before=before)
        after: dict[str, object] = {
            "attempt": started.n,
            "pid": started.pid,
            "pgid": started.pgid,
            "from_step": plan.step,
            "steps_lost": plan.steps_lost,
        }
        return ResumeResult(
            ok=True,
            before=before,
            after=after,
            message=f"attempt {started.n} started (pid {started.pid}) from step {plan.step} of {ckpt}",
        )


class AutoResume:
    """`launch --auto-resume N`: see the module docstring."""

    def __init__(self, recorder: Recorder, run: RunContext, resumer: Resumer, thresholds: Thresholds) -> None:
        self.recorder = recorder
        self.run = run
        self.resumer = resumer
        self.thresholds = thresholds
        self.max = run.settings.auto_resume
        self.done = 0
        self.stopped: str | None = None

    def _stop(self, why: str) -> None:
        self.stopped = why
        self.recorder.note(f"auto-resume stopped: {why}", kind="auto-resume")

    async def attempt_ended(self, ended: p.AttemptEnded) -> None:
        if (ended.exit_code == 0 and ended.exit_signal is None) or self.stopped:
            return
        a = self.run.state.attempt
        if a is not None and a.n == ended.n and a.stopped:
            self.recorder.note(
                f"auto-resume: attempt {a.n} was stopped by {a.stop_by}, not resumed", kind="auto-resume"
            )
            return
        if ended.error is not None:
            self._stop(f"the command could not start: {ended.error}")
            return
        if self.done >= self.max:
            self._stop(f"{self.max} automatic resume(s) used")
            return
        rd = repeat_death(self.run.state, self.thresholds)
        if rd is not None:
            self._stop("REPEAT_DEATH: " + rd.message)
            return
        delay = self.run.settings.auto_resume_delay(self.done + 1)
        self.recorder.note(
            f"auto-resume {self.done + 1}/{self.max}: checking the death criteria in {delay:.0f} s",
            kind="auto-resume",
        )
        await self._try(ended.n, delay)

    async def _try(self, n: int, delay: float) -> None:
        checks = 0
        waited_for: set[str] = set()
        while checks < 3:
            await asyncio.sleep(delay)
            a = self.run.state.attempt
            if a is None or a.n != n:
                return  # somebody resumed by hand meanwhile
            sick = sick_gpu(self.run.state)
            if sick is not None:  # the death was the GPU's: a resume would land on it again
                self._stop(sick)
                return
            verifying = sorted(self.resumer.pipeline.verifying)
            if verifying:
                # A checkpoint saved just before the death is still being verified: it may be the
                # newest resume point, and waiting for it is not a failed check (the verifier has
                # its own timeout).
                if not waited_for.issuperset(verifying):
                    waited_for.update(verifying)
                    self.recorder.note(
                        f"auto-resume waits for the verification of {', '.join(verifying)}",
                        kind="auto-resume",
                    )
                continue
            plan = await self.resumer.plan()
            if plan.ok:
                self.done += 1
                result = await self.resumer.start(plan)
                self.recorder.note(
                    f"auto-resume {self.done}/{self.max}: {result.message}", kind="auto-resume"
                )
                return
            checks += 1
            self.recorder.note("auto-resume waits: " + "; ".join(plan.refusals), kind="auto-resume")
            delay = min(delay * 2, self.run.settings.auto_resume_policy.backoff_max_s)
        self._stop("the death criteria did not hold after 3 checks")
