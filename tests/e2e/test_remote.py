"""Every command that takes a run takes ssh://[user@]host[:port]/RUN: a real sshd on 127.0.0.1, a
keeper under a second TRAINROOM_HOME reached only through it (the remote `trainroom bridge`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import run_cli
from tests.support.job_nodes import sshd
from tests.support.sshd import Sshd, remote_command
from tests.support.tui_fakes import in_loop
from tests.support.waiting import kill_runs_under, wait_for

__all__ = ["sshd"]

SLEEPER = "import time\nfor i in range(100000):\n    print(f'iter {i}: loss 1.0', flush=True)\n    time.sleep(0.2)\n"


@dataclass
class Remote:
    home: Path
    run: str
    env: dict[str, str]
    sshd: Sshd

    @property
    def target(self) -> str:
        return self.sshd.target(self.run)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env=self.env, timeout=timeout)


@pytest.fixture
def remote(trhome: Path, sshd: Sshd) -> Iterator[Remote]:
    home1 = Path(tempfile.mkdtemp(prefix="tr1", dir="/tmp"))
    try:
        out = run_cli(
            "launch",
            "--job",
            "solo",
            "--",
            sys.executable,
            "-c",
            SLEEPER,
            env=dict(os.environ, TRAINROOM_HOME=str(home1)),
        )
        assert out.returncode == 0, out.stderr
        env = dict(
            os.environ,
            TRAINROOM_HOME=str(trhome),
            TRAINROOM_SSH_COMMAND=sshd.ssh_command,
            TRAINROOM_REMOTE_COMMAND=remote_command(home1),
        )
        yield Remote(home1, out.stdout.strip(), env, sshd)
    finally:
        kill_runs_under(home1)
        shutil.rmtree(home1, ignore_errors=True)


def status(r: Remote, spec: str) -> dict:
    out = r.cli("status", spec, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_status_and_kill_of_a_remote_run_through_its_keeper(remote: Remote) -> None:
    d = wait_for(
        lambda: (s := status(remote, remote.target))["step"] is not None and s,
        timeout=60,
        what="steps over ssh",
    )
    assert (d["run"], d["keeper"], d["job"]["name"]) == (remote.run, "alive", "solo")
    # The host's newest run when the target names none: the same run.
    assert status(remote, remote.sshd.target())["run"] == remote.run
    pid = d["pid"]
    out = remote.cli("kill", remote.target, "--yes", "--json", "--grace", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    reply = json.loads(out.stdout)
    assert reply["ok"] and reply["action"] == "kill"
    wait_for(lambda: not psutil.pid_exists(pid), timeout=30, what="the remote trainer gone")
    assert status(remote, remote.target)["exit"]["signal"] is not None


def test_a_remote_run_whose_keeper_is_gone_is_read_on_its_host(remote: Remote) -> None:
    from trainroom.core.run import store

    wait_for(lambda: status(remote, remote.target)["step"] is not None, timeout=60, what="steps")
    os.environ["TRAINROOM_HOME"] = str(remote.home)
    store.stop_run(remote.home / "runs" / remote.run)  # keeper and trainer gone, journal left
    # The keeper gone, and its SIGKILLed trainer reaped (a zombie for a moment on a loaded host).
    d = wait_for(
        lambda: (
            (s := status(remote, remote.target))["keeper"] == "gone"
            and s["state"] in ("unknown", "dead")
            and s
        ),
        timeout=30,
        what="keeper gone and the trainer with it",
    )
    assert d["run"] == remote.run
    out = remote.cli("kill", remote.target, "--yes")  # run there: nothing of the run is left to kill
    assert out.returncode in (0, 1, 2) and "Traceback" not in out.stderr


def test_an_unreachable_host_and_an_unknown_run_are_one_line_and_exit_2(remote: Remote) -> None:
    closed = remote.sshd.target().rsplit(":", 1)[0] + ":1"
    out = remote.cli("status", f"{closed}/{remote.run}")
    assert out.returncode == 2 and "unreachable" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = remote.cli("status", remote.sshd.target("nosuchrun"))
    assert out.returncode == 2 and "unknown run 'nosuchrun'" in out.stderr and "Traceback" not in out.stderr
    out = remote.cli("status", "ssh://-oProxyCommand=x/r")
    assert out.returncode == 2 and "expected ssh://" in out.stderr


@in_loop
async def test_the_job_screen_shows_a_remote_node(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainroom.tui.job import JobRoom

    for k in ("TRAINROOM_SSH_COMMAND", "TRAINROOM_REMOTE_COMMAND"):
        monkeypatch.setenv(k, remote.env[k])
    app = JobRoom.following([remote.target], None)
    async with app.run_test(size=(120, 30)) as pilot:
        for _ in range(600):  # up to 60 s: the node read over ssh, then followed live
            await pilot.pause(0.1)
            if app.view and app.view.nodes[0].state == "running":
                break
        assert app.view is not None and app.view.nodes[0].state == "running", app.view
        assert app.view.head.job == "solo" and app.view.nodes[0].run == remote.run
        assert "RUNNING" in str(app.query_one("#job-head").render())
