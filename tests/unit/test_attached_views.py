"""An attached run reads as such in every view, and the control room's resume with the keeper
gone says the way on: an orphan still running is named with the two actions that act."""

from __future__ import annotations

import subprocess

import psutil

from tests.support.run_builder import RunBuilder
from trainroom.core.probes.procs import start_ticks
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import summarize
from trainroom.core.wire import protocol as p
from trainroom.tui import overview, verdict


def _attached(pid: int, start_time: float, ticks: int | None) -> RunBuilder:
    b = RunBuilder()
    b.attempt = 1
    b.apply(
        p.AttemptStarted(
            n=1,
            t=b.now,
            pid=pid,
            pgid=pid,
            start_time=start_time,
            start_ticks=ticks,
            argv=["python", "train.py"],
            cwd="/tmp",
            attached=True,
        )
    )
    return b


def test_an_attached_attempt_is_said_attached_in_status_runs_the_overview_and_the_header() -> None:
    b = _attached(4242, 1.0, None)
    b.steps(3)
    d = status_dict(b.run, keeper_alive=True)
    assert d["attached"] is True
    assert "pid 4242  attached  keeper alive" in status_lines(d)[0]
    assert summarize(b.run).attached is True
    info = RunInfo(run_id="r-test", run_dir="/tmp/r", sock="/tmp/r/s", created=b.now, argv=[], alive=True)
    assert overview.row_of(info, b.run, keeper_alive=True).attached is True
    assert verdict.header_view(b.run, b.now, connected=True).attached is True
    # A launched attempt is not.
    launched = RunBuilder()
    launched.start()
    assert status_dict(launched.run, keeper_alive=True)["attached"] is False
    assert not verdict.header_view(launched.run, launched.now, connected=True).attached


def test_resume_with_the_keeper_gone_names_the_orphan_or_acts() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        proc = psutil.Process(sleeper.pid)
        b = _attached(sleeper.pid, proc.create_time(), start_ticks(sleeper.pid))
        b.steps(3)
        b.verified(2)
        gone = verdict.Situation(connected=False)
        why = verdict.refusal(b.run, "resume", gone)
        assert why is not None
        assert f"`trainroom attach {sleeper.pid}` takes it back" in why and "`trainroom kill r-test`" in why
    finally:
        sleeper.kill()
        sleeper.wait()
    # Its process gone and its end never recorded: R acts (a new keeper takes the run up).
    assert verdict.refusal(b.run, "resume", gone) is None
    assert b.run.attempt is not None and b.run.attempt.ended_at is None  # the state itself untouched
