"""`run_of(pid)`: the one reading of which run, attempt and rank a process was started for, and
the keeper's refusal of a reporter that is not of its live attempt, read through it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from trainroom.core.keeper.server import not_of_attempt
from trainroom.core.probes.runof import RunOf, Unreadable, run_of, run_of_checked
from trainroom.core.probes.workers import rank_env
from trainroom.core.run import expire, store


@pytest.fixture
def child() -> Iterator[int]:
    env = {
        **os.environ,
        "TRAINROOM_RUN": "r-runof",
        "TRAINROOM_ATTEMPT": "2",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env
    )
    try:
        yield proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_process_of_the_run_says_its_run_attempt_and_rank(child: int) -> None:
    found = run_of(child)
    assert found == RunOf(
        run="r-runof", attempt=2, rank=3, local_rank=1, world_size=4, restarts_left=2, restart_count=1
    )
    assert rank_env(child) == found


def test_a_process_of_no_run_and_a_gone_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINROOM_RUN", raising=False)
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(proc.stdout)
    assert run_of(gone) is None
    assert isinstance(run_of_checked(gone), Unreadable)
    mine = run_of(os.getpid())
    assert mine is not None and mine.run == os.environ.get("TRAINROOM_RUN")


def test_the_keeper_refuses_a_reporter_of_another_run_or_attempt(child: int) -> None:
    assert not_of_attempt(child, "r-runof", 2) is None
    assert (
        not_of_attempt(child, "r-runof", 1) == f"hello from pid {child} of attempt 2, the live attempt is 1"
    )
    why = not_of_attempt(child, "r-other", 2)
    assert why == f"hello from pid {child}, not a process of run r-other (TRAINROOM_RUN=r-runof)"


def test_the_run_sweeps_read_a_process_s_run_through_run_of() -> None:
    """`runs prune`'s check (a run a live process still carries is kept) and `stop_run`'s sweep
    find a process by the run in its starting environment, read by run_of: a process of another
    run, or one started before the run's first attempt, is not taken."""
    marker = f"r-sweep-{os.getpid()}-{time.time_ns()}"
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "TRAINROOM_RUN": run}
        )
        for run in (marker, marker + "-other")
    ]
    try:
        assert {marker, marker + "-other"} <= expire.carried_run_ids()
        assert [p.pid for p in store._carrying(marker, since=t0)] == [procs[0].pid]
        assert store._carrying(marker, since=time.time() + 60) == []  # started before the attempt
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert marker not in expire.carried_run_ids()
