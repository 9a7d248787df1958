"""probes.locks against real flocks: a trainer whose child inherits the lock and outlives it (the
stale lock of scenario 10), first while the trainer is an unreaped zombie, then once it is gone."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.run_builder import RunBuilder
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.probes.locks import lock_holders, lock_key, parse_locks

# The trainer: take the flock, start a child that inherits the descriptor (as a data-loader or a
# helper would), say the child's pid, and die without unlocking.
TRAINER = textwrap.dedent("""
    import fcntl, os, subprocess, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(fd,),
                             start_new_session=True)
    print(child.pid, flush=True)
    os._exit(0)
""")


def _wait(pred, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_parse_proc_locks_lines() -> None:
    text = (
        "1: FLOCK  ADVISORY  WRITE 7124 fe:00:2146735 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 7200 fe:00:2146735 0 EOF\n"
        "2: OFDLCK ADVISORY  READ  -1 00:2a:99 0 EOF\n"
        "3: POSIX  ADVISORY  WRITE 88 103:02:5 0 EOF\n"
    )
    rows = parse_locks(text)
    assert [(r.kind, r.pid, r.key, r.waiter) for r in rows] == [
        ("FLOCK", 7124, "fe:00:2146735", False),
        ("FLOCK", 7200, "fe:00:2146735", True),
        ("OFDLCK", -1, "00:2a:99", False),
        ("POSIX", 88, "103:02:5", False),
    ]
    assert parse_locks("lock:\t1: FLOCK  ADVISORY  WRITE 5 08:01:7 0 EOF")[0].key == "08:01:7"


def test_a_lock_held_by_a_child_that_outlives_the_trainer_is_stale(tmp_path: Path) -> None:
    lock = tmp_path / "train.lock"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(lock)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert trainer.stdout is not None
    inheritor_pid = int(trainer.stdout.readline())
    try:
        stat = Path(f"/proc/{trainer.pid}/stat")
        _wait(lambda: stat.read_text().split(")")[-1].split()[0] == "Z")
        # The trainer is dead but not reaped: /proc/locks names it, a zombie.
        [entry] = lock_holders([str(lock)])
        assert entry.held and entry.key == lock_key(str(lock))
        [holder] = entry.holders
        assert holder.pid == trainer.pid and holder.state == "Z" and holder.kind == "FLOCK"
        assert [k.pid for k in entry.inheritors] == [inheritor_pid]

        b = RunBuilder()
        b.start(pid=trainer.pid)
        b.steps(5)
        b.end(exit_code=0)
        f = next(
            f
            for f in Watchdog().evaluate(b.run, WatchContext(alive=False, locks=[entry]), b.now).findings
            if f.code == "STALE_LOCK"
        )
        assert f"held by pid {trainer.pid}: pid {trainer.pid} is a zombie" in f.message
        assert f.evidence["kill_pids"] == [inheritor_pid] and f.action == "kill"

        trainer.wait()
        # Reaped: the lock still names the dead pid, and the child still keeps it.
        [entry] = lock_holders([str(lock)])
        assert entry.holders[0].pid == trainer.pid and entry.holders[0].exists is False
        assert [k.pid for k in entry.inheritors] == [inheritor_pid]
        f = next(
            f
            for f in Watchdog().evaluate(b.run, WatchContext(alive=False, locks=[entry]), b.now).findings
            if f.code == "STALE_LOCK"
        )
        assert f"pid {trainer.pid} no longer exists" in f.message and f"pid {inheritor_pid}" in f.message
        # And the next attempt indeed cannot take it.
        fd = os.open(lock, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the stale lock was free")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    finally:
        try:
            os.kill(inheritor_pid, signal.SIGKILL)
        except OSError:
            pass
        trainer.stdout.close()
        trainer.wait()
    _wait(lambda: not lock_holders([str(lock)])[0].held)


def test_a_lock_held_by_the_current_attempt_is_fine_and_by_another_is_stale(tmp_path: Path) -> None:
    lock = tmp_path / "train.lock"
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(lock)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        [entry] = lock_holders([str(lock)])
        assert entry.holders[0].pid == holder.pid and entry.holders[0].state in ("S", "R")
        assert entry.inheritors == []  # the named holder is alive: no descriptor scan
        b = RunBuilder()
        b.start(pid=holder.pid)
        b.steps(3)
        ctx = WatchContext(alive=True, attempt_pids=[holder.pid], locks=[entry])
        assert all(f.code != "STALE_LOCK" for f in Watchdog().evaluate(b.run, ctx, b.now).findings)
        b.start(pid=999_999)  # a new attempt while the old holder still runs
        ctx = WatchContext(alive=True, attempt_pids=[999_999], locks=[entry])
        f = next(f for f in Watchdog().evaluate(b.run, ctx, b.now).findings if f.code == "STALE_LOCK")
        assert f"pid {holder.pid}" in f.message and "not the current attempt" in f.message
        assert f.evidence["kill_pids"] == [holder.pid]
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_a_missing_or_free_lock_file_is_no_finding(tmp_path: Path) -> None:
    free = tmp_path / "free.lock"
    free.write_text("")
    entries = lock_holders([str(tmp_path / "missing.lock"), str(free)])
    assert [(e.exists, e.held) for e in entries] == [(False, False), (True, False)]
    b = RunBuilder()
    b.start()
    assert Watchdog().evaluate(b.run, WatchContext(alive=True, locks=entries), b.now).findings == []
