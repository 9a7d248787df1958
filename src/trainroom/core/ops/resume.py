"""The resume plan: from which checkpoint a new attempt would start, with which command, and
whether the death criteria hold (the old process group is gone, no lock file is held, the driver
gave the memory back, the host has the RAM the load needs). Blocking reads (/proc, /proc/locks,
the checkpoint root, NVML through the caller's probe): call it from a worker thread.

The checkpoint reaches the trainer as TRAINROOM_RESUME and through the resume command template
(`{ckpt}`, `{ckpt_dir}`, `{step}`, `{run_id}`); the new attempt's argv is what its requested LR is
parsed from, so LR_MISMATCH compares against this session's policy.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt.layout import latest_checkpoint, read_manifest, tree_bytes
from trainroom.core.ckpt.promote import intact
from trainroom.core.ckpt.targets import BEFORE_RESUME_SUFFIX
from trainroom.core.ckpt.verify import load_need_bytes
from trainroom.core.configuration.config import fill_template
from trainroom.core.health.host import host_ram_low
from trainroom.core.logs.loglines import NOT_STEPS
from trainroom.core.ops.members import Lifetime, live_members
from trainroom.core.probes.host import read_meminfo
from trainroom.core.probes.locks import lock_holders
from trainroom.core.resumable import Completeness, losses
from trainroom.core.run.parts import AttemptView
from trainroom.core.run.state import RunState
from trainroom.core.units import fmt_bytes


class WatchedTarget(msgspec.Struct, kw_only=True, frozen=True):
    """The newest watched file (an uninstrumented trainer's out/ckpt.pt) whose current bytes
    verified: nanoGPT resumes from the file it overwrites, so that file is the resume target."""

    path: str
    step: int | None
    digest: str | None


class ResumePlan(msgspec.Struct, kw_only=True):
    """What a resume would do, and why it may not (refusals); shown for confirmation."""

    ok: bool = False
    refusals: list[str] = []
    attempt: int  # the attempt it would start
    checkpoint: str | None = None
    step: int | None = None
    # A watched file's digest when it verified: checked again before the load (no sidecar has it).
    digest: str | None = None
    # The verified copy the trainer's own path (`checkpoint`) is restored from before the start:
    # a resume never hands the trainer a verified copy to write into.
    restore_from: str | None = None
    argv: list[str] = []
    # Whether a resume template shaped argv (else: the original command, the checkpoint in
    # TRAINROOM_RESUME, and the trainer decides where it starts).
    templated: bool = False
    # Where the template came from: --resume-template, trainroom.toml, or "recognised: ..." (the
    # command's script, core/logs/frameworks).
    template_from: str | None = None
    note: str = ""  # what the user should know before saying yes (shown with the plan)
    # What the checkpoint lacks of a faithful resume, as what the run loses or resets (a line each).
    lost: list[str] = []
    died_at_step: int | None = None
    steps_lost: int | None = None
    driver_bytes: int | None = None
    mem_available_bytes: int | None = None
    checkpoint_bytes: int | None = None
    load_need_bytes: int | None = None  # the RAM its load needs (the checkpoint + headroom)
    # What still stands in its way without refusing it, a line each, the fix first: the RAM an
    # ENOMEM death hid (the same load may fail the same way).
    in_the_way: list[str] = []


class ResumeInputs(msgspec.Struct, kw_only=True, frozen=True):
    """What the plan depends on beyond the run's state."""

    run_id: str
    argv: list[str]
    template: str | None
    lock_files: tuple[str, ...]
    template_from: str | None = None
    # Without a template: how the recognised framework takes the checkpoint instead.
    template_hint: str | None = None
    ckpt_root: str | None
    watched: WatchedTarget | None = None
    vram_tolerance_bytes: int
    host_ram_floor_bytes: int
    # The newest verified checkpoint of the job's other runs (a requeued Slurm job: every task
    # resumes from the same step, and only rank 0 may have saved): taken when newer than this
    # run's own, and loaded where it is (another run's promoted copy, never restored over).
    job_best: WatchedTarget | None = None


DriverBytes = Callable[[list[int]], int | None]


def _nothing_to_resume_from(state: RunState, a: AttemptView, inputs: ResumeInputs) -> str:
    """Why there is no checkpoint to resume from, and what would give one or start it again."""
    why = "no verified checkpoint: `latest` points nowhere"
    if a.attached and inputs.watched is None and not state.checkpoints:
        why = (
            "no verified checkpoint: trainroom watched none of this attached trainer's saves "
            "(`trainroom attach PID --ckpt DIR` names where it saves)"
        )
    again = shlex.join(["trainroom", "launch", "--", *(state.argv or a.argv)])
    return f"{why}; `{again}` starts it again from scratch"


def plan_resume(state: RunState, inputs: ResumeInputs, driver_bytes: DriverBytes | None) -> ResumePlan:
    a = state.attempt
    plan = ResumePlan(attempt=(a.n + 1) if a else 1)
    if a is None:
        plan.refusals.append("this run has no attempt yet")
        return plan
    plan.refusals += _life_refusals(a, state.run_id, state.attempt_workers())
    plan.refusals += held_locks(inputs.lock_files)
    plan.driver_bytes = driver_bytes([a.pid]) if driver_bytes is not None else None
    tolerance = inputs.vram_tolerance_bytes
    if plan.driver_bytes is not None and plan.driver_bytes > tolerance:
        plan.refusals.append(
            f"the driver still holds {fmt_bytes(plan.driver_bytes)} for the old attempt "
            f"(tolerance {fmt_bytes(tolerance)}): kill and wait for it to fall"
        )
    _choose_checkpoint(plan, state, inputs)
    if plan.checkpoint is None:
        plan.refusals.append(_nothing_to_resume_from(state, a, inputs))
    else:
        _check_host_ram(plan, inputs.host_ram_floor_bytes)
        plan.templated = bool(inputs.template)
        plan.template_from = inputs.template_from if plan.templated else None
        if not plan.templated:
            plan.note += (
                "no resume template: the command is unchanged and the checkpoint is only named in "
                "TRAINROOM_RESUME; the trainer decides where it starts (one that ignores it starts from "
                "scratch and may overwrite the checkpoint: set --resume-template)"
            )
            if inputs.template_hint:
                plan.note += f"; {inputs.template_hint}"
        plan.argv = _argv(plan, inputs)
        plan.lost = resume_losses(state, plan)
    plan.in_the_way = _in_the_way(state, plan)
    plan.died_at_step = a.last_step
    # Only a step in optimizer steps compares with a checkpoint's (not a log's batches or dicts).
    if a.last_step is not None and plan.step is not None and _in_steps(state, a):
        plan.steps_lost = max(0, a.last_step - plan.step)
    plan.note = plan.note.strip().rstrip(";")
    plan.ok = not plan.refusals
    return plan


def _life_refusals(a: AttemptView, run_id: str, workers: Sequence[tuple[int, int]] = ()) -> list[str]:
    out = []
    if a.ended_at is None:
        out.append(f"attempt {a.n} (pid {a.pid}) is still running: kill it first (k)")
    # By start time too: a stranger that reused the group number is not the old attempt.
    life = Lifetime(
        run_id=run_id,
        start_time=a.start_time,
        start_ticks=a.start_ticks,
        ended_at=a.ended_at,
        attached=a.attached,
    )
    live = live_members(a.pgid, life, workers)
    if live:
        out.append(
            f"{len(live)} process(es) of attempt {a.n} still live in group {a.pgid}: {live} (kill clears them)"
        )
    return out


def held_locks(paths: Sequence[str]) -> list[str]:
    """A refusal for each lock file some process holds (a relaunch could not take it)."""
    out = []
    for lk in lock_holders(paths):
        if not lk.held:
            continue
        live = [h for h in lk.holders if not h.gone]
        gone = [h for h in lk.holders if h.gone]
        # /proc/locks names the pid that took the lock; when that one is gone, the holder is
        # whoever inherited the descriptor (an orphaned child, as in scenario 10).
        who = [f"pid {h.pid} ({h.state or '?'})" for h in live + lk.inheritors]
        text = f"lock {lk.path} is held by {', '.join(who) if who else 'a process not visible here'}"
        if gone:
            dead = ", ".join(f"pid {h.pid} ({'a zombie' if h.exists else 'gone'})" for h in gone)
            text += f" through a descriptor taken by {dead}"
        out.append(text)
    return out


def _in_steps(state: RunState, a: AttemptView) -> bool:
    """Whether the attempt's step counts optimizer steps (a log may count batches or dicts)."""
    return a.instrumented or state.log_unit not in NOT_STEPS


def _promoted_step(state: RunState, ckpt: Path) -> int | None:
    """The step of the verified checkpoint `latest` points at: from the run's records, else its
    manifest, else the newest verified one the run knows."""
    for c in state.checkpoints:
        promoted = c.report.promoted_file if c.report is not None else None
        if c.state == "verified" and promoted and Path(promoted) == ckpt:
            return c.step
    manifest = read_manifest(ckpt.parent)
    if manifest is not None and manifest.step is not None:
        return manifest.step
    verified = state.last_verified()
    return verified.step if verified is not None else None


def resume_points(root: str) -> list[Path]:
    """Verified checkpoints a resume may start from, best first: `latest`, then the others from
    the newest."""
    latest = latest_checkpoint(root)
    out = [latest] if latest is not None else []
    for v in reversed(layout.verified_checkpoints(root)):
        f = Path(v.file)
        if f not in out:
            out.append(f)
    return out


def _first_intact(root: str, exclude: set[str]) -> Path | None:
    for f in resume_points(root):
        if str(f) not in exclude and intact(f.parent):
            return f
    return None


def _choose_checkpoint(plan: ResumePlan, state: RunState, inputs: ResumeInputs) -> None:
    """The highest verified step: `latest` under the root (or, when its bytes no longer match
    what was verified, the newest that does, said in the note), or a newer watched file."""
    ckpt = _first_intact(inputs.ckpt_root, set()) if inputs.ckpt_root else None
    latest = latest_checkpoint(inputs.ckpt_root) if inputs.ckpt_root else None
    if latest is not None and ckpt != latest:
        plan.note += f"`latest` ({latest}) no longer matches its verified digest: " + (
            f"resuming from {ckpt}, the newest checkpoint that verifies; " if ckpt else ""
        )
    step = _promoted_step(state, ckpt) if ckpt is not None else None
    w = inputs.watched
    if w is not None and (ckpt is None or (w.step or -1) > (step if step is not None else -1)):
        ckpt, step = Path(w.path), w.step
        plan.digest = w.digest
    j = inputs.job_best
    newer = j is not None and (ckpt is None or (j.step or -1) > (step if step is not None else -1))
    if j is not None and newer and Path(j.path).exists():
        plan.checkpoint, plan.step, plan.digest = j.path, j.step, j.digest
        plan.note += f"the newest verified checkpoint of the job's runs (step {j.step}); "
        return
    if ckpt is not None:
        plan.checkpoint, plan.step = str(ckpt), step
        _own_path(plan, ckpt, inputs)


def _own_path(plan: ResumePlan, ckpt: Path, inputs: ResumeInputs) -> None:
    """A verified copy of a watched checkpoint (nanoGPT's out/ckpt.pt, HF's checkpoint-N/) is
    restored to the trainer's own path and the trainer is pointed there: its next save goes
    where it is watched, never into the verified copy."""
    manifest = read_manifest(ckpt.parent)
    if manifest is None or not manifest.source or not inputs.ckpt_root:
        return
    root = str(Path(inputs.ckpt_root).absolute())
    source = Path(manifest.source)
    if not source.is_absolute() or str(source).startswith(root.rstrip("/") + "/"):
        return  # a candidate of this root (an SDK save): the step directory is its home
    if source.name != ckpt.name:
        return
    plan.restore_from, plan.checkpoint, plan.digest = str(ckpt), str(source), manifest.digest
    plan.note += (
        f"the trainer resumes from its own {source}, made equal to the verified copy {ckpt} first "
        f"(anything else there is kept as {source.name}{BEFORE_RESUME_SUFFIX}); "
    )


def _argv(plan: ResumePlan, inputs: ResumeInputs) -> list[str]:
    if not inputs.template or plan.checkpoint is None:
        return list(inputs.argv)
    return resume_argv(inputs.template, ckpt=plan.checkpoint, step=plan.step, run_id=inputs.run_id)


def fall_back(plan: ResumePlan, state: RunState, inputs: ResumeInputs, failed: set[str]) -> ResumePlan | None:
    """The plan again from the newest verified checkpoint not in `failed` (those that did not
    verify before the load), or None when there is none; its note says what it fell back from."""
    if not inputs.ckpt_root:
        return None
    ckpt = _first_intact(inputs.ckpt_root, failed)
    if ckpt is None:
        return None
    new = msgspec.structs.replace(plan, digest=None, restore_from=None, note="")
    new.checkpoint, new.step = str(ckpt), _promoted_step(state, ckpt)
    _own_path(new, ckpt, inputs)
    new.note = (
        (
            f"{', '.join(sorted(failed))} did not verify: resuming from {ckpt}, the newest that does; {new.note}"
        )
        .strip()
        .rstrip(";")
    )
    new.argv = _argv(new, inputs)
    new.lost = resume_losses(state, new)
    new.checkpoint_bytes = _verified_bytes(new)
    a = state.attempt
    if a is not None and a.last_step is not None and new.step is not None and _in_steps(state, a):
        new.steps_lost = max(0, a.last_step - new.step)
    return new


def checkpoint_completeness(state: RunState, ckpt: Path) -> Completeness | None:
    """What a verified checkpoint holds of a faithful resume: from the run's record of its
    verification, else its manifest (None for one verified before completeness was read)."""
    for c in state.checkpoints:
        r = c.report
        if c.state != "verified" or r is None or r.completeness is None:
            continue
        if Path(c.path) == ckpt or (r.promoted_file and Path(r.promoted_file) == ckpt):
            return r.completeness
    manifest = read_manifest(ckpt.parent)
    return manifest.report.completeness if manifest is not None and manifest.file == ckpt.name else None


def resume_losses(state: RunState, plan: ResumePlan) -> list[str]:
    """What a resume from the plan's checkpoint loses or resets, a line a missing part."""
    where = plan.restore_from or plan.checkpoint
    c = checkpoint_completeness(state, Path(where)) if where else None
    if c is None:
        return []
    fp16 = any(r.loss_scale is not None for r in state.ranks.values())
    return losses(c, step=plan.step, fp16=fp16)


def _verified_bytes(plan: ResumePlan) -> int | None:
    """The size of the bytes the resume loads: the verified copy when the trainer's own path is
    restored from one (that path may hold a torn write until then), else the checkpoint."""
    where = plan.restore_from or plan.checkpoint
    if where is None:
        return None
    ckpt = Path(where)
    try:
        return tree_bytes(ckpt) if ckpt.is_dir() else ckpt.stat().st_size
    except OSError:
        return None


def _check_host_ram(plan: ResumePlan, floor_bytes: int) -> None:
    assert plan.checkpoint is not None
    size = _verified_bytes(plan)
    if size is None:
        return
    mem = read_meminfo().get("MemAvailable")
    low = host_ram_low(mem, load_need_bytes(size), plan.checkpoint, floor_bytes=floor_bytes)
    if low is not None:
        plan.refusals.append(f"{low.message} — reclaim the page cache first (c)")
    plan.mem_available_bytes = mem
    plan.checkpoint_bytes = size
    plan.load_need_bytes = max(load_need_bytes(size), floor_bytes)


def _in_the_way(state: RunState, plan: ResumePlan) -> list[str]:
    """The open findings whose fix a resume waits on without being refused: the attempt died of
    ENOMEM behind another error (MASKED_ERROR, its fix a reclaim) while RAM now reads enough."""
    out = []
    for f in state.open_findings():
        if f.code == "MASKED_ERROR" and f.action == "reclaim":
            now = (
                f"; now {fmt_bytes(plan.mem_available_bytes)} available, the load needs "
                f"{fmt_bytes(plan.load_need_bytes)}"
                if plan.mem_available_bytes is not None and plan.load_need_bytes is not None
                else ""
            )
            outer = (f.evidence.get("outer") or {}).get("type") or "another error"
            out.append(
                f"the last attempt died of ENOMEM hidden behind `{outer}`: host RAM ran short for its "
                f"load{now}; reclaim the page cache first (C), or the same load may fail the same way"
            )
    return out


def resume_argv(template: str, *, ckpt: str, step: int | None = None, run_id: str = "") -> list[str]:
    """The argv of a resumed attempt from the command template, split like a shell would.

    Each placeholder is filled inside its own argv word, so a checkpoint path with spaces stays
    one argument.
    """
    values = {
        "ckpt": ckpt,
        # A promoted checkpoint is a directory (step-000300/); a bare file's directory is its parent.
        "ckpt_dir": ckpt if Path(ckpt).is_dir() else str(Path(ckpt).parent),
        "step": "" if step is None else str(step),
        "run_id": run_id,
    }
    return [fill_template(word, values) for word in shlex.split(template)]
