"""The keeper gone (kill -9) while its trainer runs: one path that works to the end, from the CLI.

`status` names the orphan with the two actions that act; `resume` is refused while it runs and
says so; `trainroom attach PID` takes it back under a new keeper on the same run; after a kill,
`resume` starts the next attempt of the same run from the verified checkpoint. Then the keeper is
killed again and the other way is walked: `trainroom kill` without a keeper (journaled), and
`resume` starts a new keeper for the same run, whose attempt steps.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_tmux import Pane, _trainroom_script
from tests.support.helpers import run_cli, start_demo, status_json
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs

START_S = 120


def _keeper_pid(run: str) -> int:
    pid = runs.read_record(Path(runs.resolve_run(run).run_dir)).keeper_pid
    assert pid is not None
    return pid


def _kill_keeper(run: str) -> None:
    pid = _keeper_pid(run)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not runs.resolve_run(run).alive, timeout=30, what="the keeper gone")


def _stepping(run: str, attempt: int) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        d = status_json(run)
        return d if d["attempt"] == attempt and d["state"] == "running" and d["keeper"] == "alive" else None

    return wait_for(ok, timeout=START_S, what=f"attempt {attempt} stepping under a keeper")


def test_keeper_killed_the_orphan_is_taken_back_or_killed_and_the_run_resumes(trhome: Path) -> None:
    info = start_demo(fault="nan", fault_step=60, ckpt_every=25, step_delay=0.05)
    run = info.run_id
    wait_for(
        lambda: any(c["state"] == "verified" for c in status_json(run)["checkpoints"]),
        timeout=START_S,
        what="a verified checkpoint",
    )
    d = status_json(run)
    trainer = d["pid"]
    _kill_keeper(run)

    d = status_json(run)
    assert d["state"] == "orphaned" and d["keeper"] == "gone", d
    reason = d["state_reason"]
    assert f"trainroom kill {run}" in reason and f"trainroom attach {trainer}" in reason, reason
    assert "last write" in reason
    out = run_cli("resume", run, "--yes")
    assert out.returncode == 2 and f"trainroom attach {trainer}" in out.stderr, out.stderr

    # Take it back: the same run, a new keeper, the same attempt watched again.
    out = run_cli("attach", str(trainer))
    assert out.returncode == 0 and out.stdout.strip() == run, out.stdout + out.stderr
    assert _keeper_pid(run) != 0 and runs.resolve_run(run).alive
    d = wait_for(
        lambda: (s := status_json(run))["state"] in ("running", "hung") and s["pid"] == trainer and s,
        timeout=60,
        what="the orphan watched again",
    )
    assert d["attempt"] == 1
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_cli("resume", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    d = _stepping(run, 2)
    assert d["run"] == run and d["pid"] != trainer

    # The keeper killed again: kill the orphan without a keeper, then resume starts a new keeper.
    second = d["pid"]
    _kill_keeper(run)
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0 and "journaled here" in out.stdout, out.stdout + out.stderr
    d = status_json(run)
    assert d["state"] == "stopped" and d["keeper"] == "gone", d
    out = run_cli("resume", run, "--yes")
    assert out.returncode == 0 and "a new keeper takes the run up" in out.stdout, out.stdout + out.stderr
    d = _stepping(run, 3)
    assert d["pid"] not in (trainer, second)
    run_cli("kill", run, "--yes")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: no real terminal")
def test_tmux_keeper_killed_the_control_room_names_the_way_on_and_r_resumes(
    trhome: Path,
) -> None:
    """The same path in a real terminal: the banner names the orphan's two ways on (R would not
    act), `trainroom kill` in a shell ends it, the banner then offers R, and R + y starts attempt 2
    under a new keeper, stepping."""
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    info = start_demo(fault="nan", fault_step=60, ckpt_every=25, step_delay=0.05)
    run = info.run_id
    wait_for(
        lambda: any(c["state"] == "verified" for c in status_json(run)["checkpoints"]),
        timeout=START_S,
        what="a verified checkpoint",
    )
    trainer = status_json(run)["pid"]
    _kill_keeper(run)
    pane = Pane(trhome, (160, 48))
    try:
        _walk(pane, script, run, trainer)
    finally:
        pane.close()
    run_cli("kill", run, "--yes")


def _walk(pane: Pane, script: str, run: str, trainer: int) -> None:
    pane.start(f"{shlex.quote(script)} watch {run}")
    # The header says the state `status` says (run.gone): ORPHANED, not the journal's RUNNING.
    screen = pane.wait("keeper gone since", f"trainroom attach {trainer}", " ORPHANED ", timeout=60)
    assert " RUNNING " not in screen.splitlines()[0]
    pane.keys("R")
    pane.wait("resume: not now", timeout=30)
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    pane.wait("press R to resume", timeout=60)
    pane.keys("R")
    pane.wait("yes, resume (y)", timeout=120)
    pane.keys("y")
    pane.wait("resume: done", timeout=120)
    d = _stepping(run, 2)
    assert d["run"] == run and d["pid"] != trainer
    pane.keys("Escape")
    pane.wait(" RUNNING ", timeout=60)
    pane.keys("q")
