"""A requeued Slurm job is the same run, one attempt later: which run a requeued task takes up
(cli/requeue.py), and the resume plan a requeued attempt runs (ops/resume.py with the job's
newest verified checkpoint, keeper/requeue.py), on real run records and promoted checkpoints.
The whole flow under a real Slurm: tests/e2e/test_slurm.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt import promote as pr
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.cli.requeue import same_task, task_run
from trainroom.core.configuration.settings import JobOptions, LaunchOptions
from trainroom.core.keeper.requeue import job_best, pending
from trainroom.core.ops.resume import ResumeInputs, WatchedTarget, plan_resume
from trainroom.core.run import store
from trainroom.core.run.state import AttemptView, RunState
from trainroom.core.sdk.lr import requested_from_argv
from trainroom.core.slurm.place import SlurmPlace


def _place(restart: int = 0, procid: int = 0, step: str | None = "0", job: str = "42") -> SlurmPlace:
    return SlurmPlace(job_id=job, step_id=step, node="n1", procid=procid, ntasks=2, restart_count=restart)


def test_the_same_task_is_the_same_job_step_and_rank_from_an_earlier_start() -> None:
    now = _place(restart=1)
    assert same_task(_place(restart=0), now)
    assert not same_task(None, now)
    assert not same_task(_place(restart=1), now)  # this very start (a second srun of the same rank)
    assert not same_task(_place(restart=0, procid=1), now)  # another rank
    assert not same_task(_place(restart=0, job="43"), now)  # another job
    assert not same_task(_place(restart=0, step="1"), now)  # the batch script's next srun line
    # a node changed between the starts is still the same task (Slurm places it anew)
    moved = SlurmPlace(job_id="42", step_id="0", node="n2", procid=0, ntasks=2, restart_count=0)
    assert same_task(moved, now)
    arr = SlurmPlace(job_id="50", array_job_id="49", array_task_id="1", step_id="0", restart_count=0)
    assert not same_task(arr, SlurmPlace(job_id="50", array_job_id="49", array_task_id="2", restart_count=1))


def _run(place: SlurmPlace, argv: list[str], journal: bool = True) -> str:
    job = JobOptions(name=f"slurm-{place.job_id}", source="SLURM_JOB_ID", host="n1", node_rank=place.procid)
    run_dir, rec = store.create_run(argv, "/tmp", LaunchOptions(job=job, slurm=place, foreground=True))
    if journal:  # its keeper came up and journaled
        (run_dir / store.JOURNAL_NAME).write_bytes(b"")
    return rec.run_id


def test_a_requeued_task_finds_its_own_run_among_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path))
    rank0 = _run(_place(procid=0), ["python", "a.py"])
    rank1 = _run(_place(procid=1), ["python", "a.py"])
    _run(_place(procid=0, job="7"), ["python", "a.py"])  # another job's rank 0
    found = task_run("slurm-42", _place(restart=1, procid=1))
    assert found is not None and found[0].run_id == rank1
    found = task_run("slurm-42", _place(restart=1, procid=0))
    assert found is not None and found[0].run_id == rank0
    assert task_run("slurm-42", _place(restart=1, procid=2)) is None  # a task the job did not have
    assert task_run("slurm-42", _place(restart=0, procid=0)) is None  # the first start: a new run
    assert task_run("slurm-8", _place(restart=1, job="8")) is None
    # A run whose keeper never came up (no journal) is not followed: the task starts a new one.
    _run(_place(procid=3), ["python", "a.py"], journal=False)
    assert task_run("slurm-42", _place(restart=1, procid=3)) is None


def _promoted(root: Path, step: int) -> Path:
    q = ck.Quarantine(root).ensure()
    cand = q / ck.candidate_name(step)
    cand.write_bytes(bytes([step % 256]) * 64)
    rep = VerifyReport(ok=True, path=str(cand), size_bytes=64, digest=digest_file(cand), step=step)
    d = pr.promote(cand, rep, root)
    m = ck.read_manifest(d)
    assert m is not None and m.ok
    return d / m.file


def _ended_state() -> RunState:
    st = RunState(run_id="r", argv=["python", "t.py", "--lr", "3e-3"], cwd="/tmp", created=0.0)
    st.attempts.append(
        AttemptView(
            n=1, pid=10, pgid=4_000_000, start_time=0.0, started_at=0.0, argv=["t"], cwd="/", ended_at=5.0
        )
    )
    return st


def _inputs(root: Path, best: WatchedTarget | None) -> ResumeInputs:
    return ResumeInputs(
        run_id="r",
        argv=["python", "t.py", "--lr", "3e-3"],
        template="python t.py --lr 1e-4 --init-from {ckpt}",
        lock_files=(),
        ckpt_root=str(root),
        vram_tolerance_bytes=0,
        host_ram_floor_bytes=0,
        job_best=best,
    )


def test_a_requeued_attempt_resumes_from_the_jobs_newest_verified_step_with_the_sessions_lr(
    tmp_path: Path,
) -> None:
    own, other = tmp_path / "own", tmp_path / "rank0"
    theirs = _promoted(other, 30)
    opts = LaunchOptions(
        slurm=_place(restart=1), resume_from=str(theirs), resume_step=30, requeue_pending=True
    )
    best = job_best(opts)
    assert pending(opts) and not pending(LaunchOptions(requeue_pending=True))  # Slurm's only
    assert best is not None and best.step == 30 and best.digest == digest_file(theirs)
    # This task saved nothing (rank 0 saves): the job's checkpoint, loaded where it is.
    plan = plan_resume(_ended_state(), _inputs(own, best), None)
    assert plan.ok, plan.refusals
    assert plan.checkpoint == str(theirs) and plan.step == 30 and plan.restore_from is None
    assert plan.digest == best.digest and "newest verified checkpoint of the job's runs" in plan.note
    # ...run with the resume command, which carries this session's LR policy.
    assert plan.argv == ["python", "t.py", "--lr", "1e-4", "--init-from", str(theirs)]
    assert requested_from_argv(plan.argv).lr == pytest.approx(1e-4)
    # Its own newer verified step wins; an older one does not.
    mine = _promoted(own, 40)
    plan = plan_resume(_ended_state(), _inputs(own, best), None)
    assert plan.checkpoint == str(mine) and plan.step == 40
    plan = plan_resume(
        _ended_state(), _inputs(own, WatchedTarget(path=str(theirs), step=50, digest=None)), None
    )
    assert plan.checkpoint == str(theirs) and plan.step == 50
    # Without any: the plan says there is nothing (keeper/requeue starts from scratch then).
    plan = plan_resume(_ended_state(), _inputs(tmp_path / "none", None), None)
    assert plan.checkpoint is None and not plan.ok
    # The job's checkpoint gone from disk is not offered.
    gone = WatchedTarget(path=str(tmp_path / "gone.pt"), step=90, digest=None)
    plan = plan_resume(_ended_state(), _inputs(tmp_path / "none", gone), None)
    assert plan.checkpoint is None


def test_a_job_slurmctld_forgot_prints_the_sbatch_that_starts_it_again_from_its_verified_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trainroom job slurm:JOBID --resume` of a purged job: the exact sbatch, whose launch
    flags parse back (with trainroom's own parser) to the options the job's runs had, and whose
    TRAINROOM_RESUME_JOB makes the new job's launch resume from the old job's verified step."""
    import argparse
    import shlex

    from trainroom.core.cli.launch import launch_options
    from trainroom.core.cli.main import build_parser
    from trainroom.core.cli.slurmjob import resume_job
    from trainroom.core.slurm.scontrol import SlurmReader

    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    root, cwd = tmp_path / "ckpt", tmp_path / "my project"
    cwd.mkdir()
    place = SlurmPlace(job_id="77", step_id="0", node="n1", nnodes=2, ntasks=2, restart_count=1)
    recorded = LaunchOptions(
        job=JobOptions(name="slurm-77", source="SLURM_JOB_ID", host="n1", node_rank=0),
        slurm=place,
        foreground=True,
        ckpt_root=str(root),
        resume_template="python t.py --lr 1e-4 --init-from {ckpt}",
        checkpoint_signal="USR1",
        keep=3,
        lock_files=[str(tmp_path / "train.lock")],
        watch_ckpt=[str(cwd / "out" / "*.pt")],
        disk_budget_bytes=1 << 30,
    )
    argv = ["python", "t.py", "--lr", "3e-3", "--name", "a b"]
    store.create_run(argv, str(cwd), recorded)
    saved = _promoted(root, 30)
    # What Slurm 22.05's scontrol answers for a job it has purged (MinJobAge passed).
    reader = SlurmReader(runner=lambda a: (1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    assert resume_job(argparse.Namespace(yes=False), "77", reader) == 0
    head, line = capsys.readouterr().out.splitlines()
    assert head == (
        f"slurm job 77 is gone from slurmctld; the next attempt resumes from step 30 ({saved}). "
        "Start it again with:"
    )
    words = shlex.split(line)
    assert words[:7] == [
        "cd",
        str(cwd),
        "&&",
        "sbatch",
        "-N2",
        "-n2",
        "--export=ALL,TRAINROOM_RESUME_JOB=slurm-77",
    ]
    assert words[7] == "--wrap" and len(words) == 9
    wrapped = shlex.split(words[8])
    assert wrapped[:3] == ["srun", "trainroom", "launch"]
    # The new job's launch, as srun starts it: the same command and options...
    args = build_parser().parse_args(wrapped[1:][1:])
    assert args.command == ["--", *argv]
    args.foreground = True  # inside the srun step
    monkeypatch.setenv("TRAINROOM_RESUME_JOB", "slurm-77")  # --export=ALL,TRAINROOM_RESUME_JOB=...
    got = launch_options(args, argv)
    for field in ("ckpt_root", "resume_template", "checkpoint_signal", "keep", "lock_files", "watch_ckpt"):
        assert getattr(got, field) == getattr(recorded, field), field
    assert got.disk_budget_bytes == recorded.disk_budget_bytes
    # ...resuming from the old job's verified step.
    assert (got.resume_from, got.resume_step) == (str(saved), 30)
    # A job gone with no run of it here: one line, not a guess.
    from trainroom.core.cli.errors import CliError

    with pytest.raises(CliError, match="slurmctld does not know the job and no run of slurm-78 is here"):
        resume_job(argparse.Namespace(yes=False), "78", reader)


def test_a_checkpoint_request_older_than_the_trainer_is_an_earlier_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request file stays in the run's directory: a requeued (or resumed) attempt's new
    trainer must not save again for the request its predecessor answered."""
    import os

    import psutil

    from trainroom.core.sdk import requests

    assert abs(requests.process_start() - psutil.Process().create_time()) < 1.0
    monkeypatch.setenv("TRAINROOM_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    monkeypatch.setattr(requests._Poll, "seen", None)
    monkeypatch.setattr(requests._Poll, "started", None)
    requests.write_request(tmp_path, "USR2-1")
    before = requests.process_start() - 60.0  # written by the launch of an earlier attempt
    os.utime(tmp_path / requests.REQUEST_NAME, (before, before))
    assert not requests.checkpoint_requested(every_s=0)
    requests.write_request(tmp_path, "USR2-2")  # the job's signal while this trainer runs
    assert requests.checkpoint_requested(every_s=0)
    assert not requests.checkpoint_requested(every_s=0)  # answered once
