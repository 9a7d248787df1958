"""One process's signal (the processes table's kill), on real processes this test starts: sent only
to a process proven the run's (started within the attempt, the run id in its environment, the
start tick shown), through a pidfd, with the state before -> after; refused otherwise, nothing sent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from trainroom.core.actions.kill import Kill, KillArgs
from trainroom.core.ops.members import Lifetime
from trainroom.core.ops.signal_one import execute_signal, plan_signal, signal_name
from trainroom.core.probes.procs import read_stat

RUN = "20260101-000000-sig-test"


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "TRAINROOM_RUN": RUN}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    time.sleep(0.2)
    yield proc
    proc.kill()
    proc.wait()


def _life(start: float) -> Lifetime:
    return Lifetime(run_id=RUN, start_time=start)


def test_a_proven_process_gets_the_chosen_signal_and_the_result_says_before_and_after(child) -> None:
    ticks = read_stat(child.pid).start_ticks  # type: ignore[union-attr]
    plan = plan_signal(child.pid, "STOP", start_ticks=ticks, life=_life(time.time() - 60), keeper_pid=None)
    assert plan.ok, plan.refusals
    ok, message, before, after = execute_signal(plan)
    assert ok and before["state"] in ("sleeping", "running") and after["state"] == "stopped", message
    assert read_stat(child.pid).state == "T"  # type: ignore[union-attr]
    ok, _, _, after = execute_signal(
        plan_signal(child.pid, "CONT", start_ticks=ticks, life=_life(0), keeper_pid=None)
    )
    assert ok and after["state"] != "stopped"
    ok, message, _, after = execute_signal(
        plan_signal(child.pid, "TERM", start_ticks=ticks, life=_life(0), keeper_pid=None)
    )
    child.wait(timeout=10)
    assert ok and "SIGTERM" in message


def test_a_reused_pid_another_run_or_a_process_older_than_the_attempt_is_refused(child) -> None:
    ticks = read_stat(child.pid).start_ticks  # type: ignore[union-attr]
    reused = plan_signal(child.pid, "KILL", start_ticks=ticks + 1, life=_life(0), keeper_pid=None)
    assert not reused.ok and "reused pid" in reused.refusals[0]
    other = plan_signal(
        child.pid, "KILL", start_ticks=ticks, life=Lifetime(run_id="another", start_time=0), keeper_pid=None
    )
    assert not other.ok and "belongs to run" in other.refusals[0]
    older = plan_signal(child.pid, "KILL", start_ticks=ticks, life=_life(time.time() + 60), keeper_pid=None)
    assert not older.ok and "before the attempt" in older.refusals[0]
    me = plan_signal(os.getpid(), "STOP", start_ticks=None, life=_life(0), keeper_pid=None)
    assert not me.ok and "keeper, this process" in me.refusals[0]
    assert child.poll() is None and read_stat(child.pid).state != "T"  # type: ignore[union-attr]


def test_the_arguments_are_checked_before_anything_is_planned() -> None:
    kill = Kill()
    assert signal_name("sigstop") == "STOP" and signal_name("HUP") is None
    assert "one of TERM, INT, KILL, USR1, STOP, CONT" in (kill.validate(KillArgs(pid=42, signal="HUP")) or "")
    assert "give its pid" in (kill.validate(KillArgs(signal="STOP")) or "")
    assert "not both" in (kill.validate(KillArgs(pid=42, finding="X")) or "")
    assert kill.validate(KillArgs(pid=42, signal="usr1")) is None


def test_a_signal_the_cli_does_not_know_is_one_line_and_exit_2(tmp_path, monkeypatch) -> None:
    from tests.support.helpers import run_cli

    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path))
    out = run_cli("kill", "somerun", "--pid", "42", "--signal", "HUP")
    assert out.returncode == 2 and "'HUP' is not one of TERM, INT, KILL, USR1, STOP, CONT" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
