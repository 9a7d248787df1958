"""`launch --foreground`, and every launch inside a Slurm step (`srun trainroom launch -- CMD`):
the keeper starts as usual (it journals, serves clients, judges), but `launch` stays for the run's
life, copies the trainer's log to its own stdout (Slurm's job output), forwards SIGTERM and
SIGINT to the keeper (which stops the trainer's process group through its kill plan and journals
why), and exits with the trainer's status: its exit code, or 128+N when signal N ended it.

Why: a `launch` that returns at once ends the step: with proctrack/cgroup Slurm kills the keeper
and trainer then, with proctrack/linuxproc they escape the job and train on a node Slurm thinks
is free.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run import store
from trainroom.core.sdk.requests import write_request

# A new job started from an old one's checkpoint (`job slurm:JOBID --resume` of a job slurmctld
# forgot prints an sbatch with it): the old job's name, whose newest verified checkpoint is resumed.
ENV_RESUME_JOB = "TRAINROOM_RESUME_JOB"
EXIT_NO_STATUS = 1  # the keeper ended without a trainer exit to report (it never started, or died)
COPY_CHUNK = 1 << 16


def exit_status(run_dir: str) -> tuple[int, str | None]:
    """The trainer's last attempt as a shell status (128+N for signal N), and why when there is none."""
    try:
        a = store.load_view(run_dir).state.attempt
    except (store.RunError, OSError) as exc:
        return EXIT_NO_STATUS, f"the run's journal cannot be read: {exc}"
    if a is None:
        return EXIT_NO_STATUS, "no attempt was journaled"
    if a.alive:
        return EXIT_NO_STATUS, f"the keeper exited while attempt {a.n} (pid {a.pid}) still ran"
    if a.exit_signal is not None:
        return 128 + a.exit_signal, None
    return (a.exit_code if a.exit_code is not None else EXIT_NO_STATUS), None


class _LogCopy(threading.Thread):
    """trainer.log, as it grows, onto our stdout (what Slurm writes to the job's output file)."""

    def __init__(self, path: Path, start: int = 0) -> None:
        super().__init__(name="trainroom-log-copy", daemon=True)
        self.path, self.done, self.start_at = path, threading.Event(), start

    def run(self) -> None:
        pos = self.start_at  # a requeued run's earlier attempts are in the job's earlier output
        while True:
            finished = self.done.is_set()
            try:
                with open(self.path, "rb") as f:
                    f.seek(pos)
                    while chunk := f.read(COPY_CHUNK):
                        pos += len(chunk)
                        sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
            except OSError:
                pass
            if finished:
                return
            self.done.wait(0.2)


def checkpoint_signal(name: str | None) -> signal.Signals:
    """`--checkpoint-signal USR2` (or SIGUSR2, or a number) as a signal; USR2 by default."""
    word = (name or "USR2").upper().removeprefix("SIG")
    if word.isdigit():
        return signal.Signals(int(word))
    return signal.Signals[f"SIG{word}"]


def run_foreground(argv: list[str], options: LaunchOptions, env: dict[str, str]) -> int:
    ask = checkpoint_signal(options.checkpoint_signal)
    # Blocked, then ignored, before the keeper starts. Ignored: the keeper and the trainer inherit
    # it ignored (srun delivers the job's warning signal to every process of the step, and by
    # default it would end them). Blocked: one that comes while the keeper starts (a second or
    # two) waits, pending, for the handler below instead of being lost; the keeper clears the
    # mask it inherits (keeper/__main__.py), so the trainer starts with none.
    signal.pthread_sigmask(signal.SIG_BLOCK, {ask})
    for sig in {signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, ask}:
        signal.signal(sig, signal.SIG_IGN)
    from trainroom.core.cli import requeue

    # A requeued Slurm job's task goes on with its run (cli/requeue.py), else a new run.
    info, keeper, log_from = requeue.start(argv, options, env, os.path.abspath(os.getcwd()))
    print(info.run_id, flush=True)
    copy = _LogCopy(Path(info.run_dir) / store.LOG_NAME, log_from)
    copy.start()

    def forward(sig: int, _frame: FrameType | None) -> None:
        if keeper.poll() is None:
            os.kill(keeper.pid, sig)

    def checkpoint_now(_sig: int, _frame: FrameType | None) -> None:
        write_request(info.run_dir, f"{ask.name}-{time.time():.3f}")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    signal.signal(ask, checkpoint_now)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {ask})  # one that came meanwhile is answered now
    rc = keeper.wait()
    copy.done.set()
    copy.join(timeout=5.0)
    status, why = exit_status(info.run_dir)
    if why is not None:
        print(
            f"trainroom launch: {info.run_id}: {why} (keeper exit {rc}; see {info.run_dir}/keeper.log)",
            file=sys.stderr,
        )
    return status


def previous_verified(job: str, before_run: str | None = None) -> tuple[str, int] | None:
    """The newest verified (promoted) checkpoint of the job's earlier runs here (any task, each
    run's checkpoint root): where a requeued attempt resumes. Its file and step, or None."""
    from trainroom.core.ckpt.layout import verified_checkpoints
    from trainroom.core.job.discover import job_runs

    best: tuple[int, float, str] | None = None
    for info in job_runs(job):
        if info.run_id == before_run:
            continue
        try:
            root = store.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)
        except store.RunError:
            continue
        for v in verified_checkpoints(root):
            path = Path(v.dir) / v.file
            if path.exists() and (best is None or (v.step, v.saved_at) > best[:2]):
                best = (v.step, v.saved_at, str(path))
    return (best[2], best[0]) if best is not None else None
