"""`trainroom launch --foreground` outside Slurm (CI, a container, a script that waits): `launch`
stays for the run's life, copies the trainer's log to its stdout, and exits with the trainer's
status; the checkpoint signal (USR2) asks the trainer to checkpoint, even one that comes while
`launch` is still starting its keeper (it waits, blocked, instead of being lost); SIGTERM stops the
trainer through the kill plan.

Every process touched is this test's own `launch` (its pid from Popen) and the run it started
(`trhome` tears down whatever carries the test's TRAINROOM_HOME)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store
from trainroom.core.run.store import JOURNAL_NAME
from trainroom.core.wire import protocol as p

START_S = 120  # a keeper and a torch trainer starting on a loaded 2-core machine


def _launch(*trainer_args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "trainroom.cli", "launch", "--foreground", "--"]
    argv += [sys.executable, "-m", "trainroom.core.demo.train", *trainer_args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _blocked(pid: int, sig: int) -> bool:
    """`sig` is in the process's blocked mask (SigBlk in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(mask >> (sig - 1) & 1)


def _notes(run_dir: str) -> list[str]:
    return [r.message for r in read_journal(Path(run_dir) / JOURNAL_NAME) if isinstance(r, p.KeeperNote)]


def _the_run() -> store.RunInfo | None:
    runs = store.list_runs()
    return runs[-1] if runs else None


def test_foreground_launch_exits_with_the_trainers_status_and_copies_its_log(trhome: Path) -> None:
    proc = _launch("--steps", "30", "--step-delay", "0.01", "--ckpt-every", "0")
    out, err = proc.communicate(timeout=START_S + 60)
    assert proc.returncode == 0, err
    info = _the_run()
    assert info is not None and out.splitlines()[0] == info.run_id  # the run id first, as launch prints it
    log = (Path(info.run_dir) / store.LOG_NAME).read_text(errors="replace")
    assert log.strip() and log.strip().splitlines()[-1] in out  # the trainer's log, on our stdout
    a = store.load_view(info.run_dir).state.attempt
    assert a is not None and a.exit_code == 0 and not a.alive


def test_a_checkpoint_signal_that_comes_while_the_keeper_starts_is_answered(trhome: Path) -> None:
    proc = _launch("--steps", "100000", "--step-delay", "0.05", "--ckpt-every", "0")
    try:
        # launch holds the signal blocked from before it starts its keeper: sent now, it waits.
        wait_for(lambda: _blocked(proc.pid, signal.SIGUSR2), START_S, 0.005, "launch blocking USR2")
        said_before = _the_run()
        os.kill(proc.pid, signal.SIGUSR2)
        info = wait_for(_the_run, START_S, 0.1, "the run")
        print(f"USR2 sent {'before' if said_before is None else 'after'} the run's directory existed")

        def asked() -> str | None:
            found = [n for n in _notes(info.run_dir) if "asked the trainer to checkpoint now" in n]
            return found[0] if found else None

        note = wait_for(asked, START_S, 0.2, "the keeper asking the trainer to checkpoint")
        assert note.startswith("SIGUSR2 (the job's warning signal): asked the trainer to checkpoint now"), (
            note
        )
        assert proc.poll() is None, "launch ended of the signal"
        # The trainer starts with nothing blocked (the keeper cleared the mask it inherited).
        a = wait_for(lambda: store.load_view(info.run_dir).state.attempt, START_S, 0.2, "the attempt")
        assert not _blocked(a.pid, signal.SIGUSR2)
        # SIGTERM to launch: the trainer is stopped through the kill plan; launch exits with its status.
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=START_S)
        st = store.load_view(info.run_dir).state
        assert st.status == "stopped", st.status_reason
        assert proc.returncode in (128 + signal.SIGTERM, 128 + signal.SIGKILL, 0), proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
