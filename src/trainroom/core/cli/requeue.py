"""`srun trainroom launch -- CMD` in a requeued Slurm job (SLURM_RESTART_COUNT = N > 0): the
task's run goes on, one attempt later, instead of a new run starting.

The task's run is the newest run here of the same Slurm job (`slurm-<JOBID>`, arrays by their
task) whose record names the same step and task (SLURM_STEP_ID: the batch script's srun lines are
numbered again from 0 in each start of the job; SLURM_PROCID: the rank, or the node with one task
per node) from an earlier start (its restart count below this one). Its record takes this
session's options (the new restart count, the launch flags, the command) and `requeue_pending`,
and a keeper is started on it: that keeper journals "requeued by Slurm (restart N)" and resumes
the run as its next attempt (keeper/requeue.py). No such run here (the state dir is not shared
between the nodes, or the run was removed): a new run, as before, resuming from the newest
verified checkpoint of the job's runs found here.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgspec

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.job.discover import job_runs
from trainroom.core.run import store
from trainroom.core.run.launch import check_command, check_config, check_options, launch_keeper, spawn_keeper
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.slurm.place import SlurmPlace

# The old step's keeper is ended by Slurm before the job is requeued; one still here (the same
# node, still exiting) is waited for this long before the run is taken up.
OLD_KEEPER_WAIT_S = 30.0


def same_task(earlier: SlurmPlace | None, now: SlurmPlace) -> bool:
    """`earlier` is this task in an earlier start of the same job."""
    return (
        earlier is not None
        and earlier.job_id == now.job_id
        and earlier.array_job_id == now.array_job_id
        and earlier.array_task_id == now.array_task_id
        and earlier.procid == now.procid
        and (earlier.step_id is None or now.step_id is None or earlier.step_id == now.step_id)
        and earlier.restart_count < now.restart_count
    )


def task_run(job: str, place: SlurmPlace) -> tuple[RunInfo, store.RunRecord] | None:
    """The run this task had in the job's earlier start, the newest such, with its record."""
    found: tuple[RunInfo, store.RunRecord] | None = None
    for info in job_runs(job):
        try:
            rec = store.read_record(Path(info.run_dir))
        except RunError:
            continue
        # One whose keeper never came up has no attempt to follow: the task starts a new run.
        if same_task(rec.options.slurm, place) and (Path(info.run_dir) / store.JOURNAL_NAME).exists():
            found = (info, rec)
    return found


def _keeper_gone(rec: store.RunRecord, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while store.keeper_alive(rec):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def start(
    argv: list[str], options: LaunchOptions, env: dict[str, str], cwd: str
) -> tuple[RunInfo, subprocess.Popen[bytes], int]:
    """The keeper of this launch: on the task's run when the job was requeued and that run is
    here, else on a new run; and where this launch's part of the run's trainer.log begins."""
    place, job = options.slurm, options.job
    if place is None or place.restart_count == 0 or job is None or env.get("TRAINROOM_RESUME_JOB"):
        return (*launch_keeper(argv, options, cwd=cwd, env=env), 0)
    found = task_run(job.name, place)
    if found is None:
        return (*launch_keeper(argv, options, cwd=cwd, env=env), 0)
    info, rec = found
    if not _keeper_gone(rec, OLD_KEEPER_WAIT_S):
        print(
            f"trainroom launch: the keeper of {info.run_id} (pid {rec.keeper_pid}) is still running: "
            "a new run is started for this requeued task",
            file=sys.stderr,
        )
        return (*launch_keeper(argv, options, cwd=cwd, env=env), 0)
    check_command(argv, cwd)
    check_config(cwd)
    check_options(options)
    run_dir = Path(info.run_dir)
    rec.options = msgspec.structs.replace(options, requeue_pending=True)
    rec.argv, rec.cwd, rec.start_error = list(argv), cwd, None
    store.write_record(run_dir, rec)
    (run_dir / store.SOCKET_NAME).unlink(missing_ok=True)  # the old keeper's: not a sign of the new one
    try:
        log_from = (run_dir / store.LOG_NAME).stat().st_size
    except OSError:
        log_from = 0
    return (*spawn_keeper(run_dir, rec, env), log_from)


def launch_flags(opts: LaunchOptions) -> list[str]:
    """The `trainroom launch` flags that give a new job's runs the options these were launched
    with (`job slurm:JOBID --resume` of a job slurmctld forgot prints them in its sbatch). The
    alert targets are left out: they may hold secrets (trainroom.toml's [notify] still applies)."""
    out: list[str] = []
    pairs: list[tuple[str, object]] = [
        ("--ckpt-root", opts.ckpt_root),
        ("--resume-template", opts.resume_template),
        ("--log-pattern", opts.log_pattern),
        ("--eval-command", opts.eval_command),
        ("--keep", opts.keep),
        ("--auto-resume", opts.auto_resume),
        ("--disk-budget", opts.disk_budget_bytes),
        ("--checkpoint-signal", opts.checkpoint_signal),
    ]
    for flag, value in pairs:
        if value is not None:
            out += [flag, str(value)]
    for path in opts.lock_files:
        out += ["--lock-file", path]
    for glob in opts.watch_ckpt:
        out += ["--watch-ckpt", glob]
    if opts.keep_verified_copies:
        out.append("--keep-verified-copies")
    return out
