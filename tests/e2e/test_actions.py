"""Actions you can trust: what runs is what was confirmed, and only processes proven the run's are
ever signalled. Real keepers, real trainers, real strangers."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil

from tests.support.helpers import start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.settings import LaunchOptions


def _verified(info: runs.RunInfo) -> int:
    return sum(1 for c in status(info)["checkpoints"] if c["state"] == "verified")


def test_a_confirmation_of_an_older_plan_is_refused_with_the_difference(trhome: Path) -> None:
    info = start_demo(ckpt_every=5, step_delay=0.05)
    wait_for(lambda: _verified(info) >= 3, timeout=120, what="three verified checkpoints")
    c = KeeperClient(info.sock)
    plan = c.call("prune", {"keep": 2}, confirm=False)
    assert plan.stage == "plan"
    shown = len(plan.plan["delete"])
    # The run goes on saving: by the time the user says yes, the plan is stale.
    wait_for(lambda: _verified(info) >= 3 + shown + 2, timeout=120, what="more checkpoints")
    r = c.call("prune", {"keep": 2, "expect": plan.plan}, confirm=True)
    assert not r.ok and "the target changed since it was confirmed" in r.message
    assert f"confirmed {shown} checkpoint(s) to delete" in r.message
    # Nothing was deleted on the strength of a plan nobody saw.
    assert not [x for x in status(info)["checkpoints"] if x["state"] == "pruned"]
    # A confirmation without the plan it confirms is refused too.
    r = c.call("prune", {"keep": 2}, confirm=True)
    assert not r.ok and "args.expect" in r.message
    # Plan and confirm of the same targets: it runs.
    r = c.confirmed("prune", {"keep": 2})
    assert r.ok, r.message
    assert [x for x in status(info)["checkpoints"] if x["state"] == "pruned"]


# The trainer leaves a helper behind in its process group and exits. The helper waits for the
# test's word, then starts a stranger in the same (now leaderless) group: started after the
# attempt ended, without the run's id in its environment. Kill must take the helper and leave the
# stranger alone.
HELPER = """
import os, subprocess, sys, time
go, out = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.05)
env = {k: v for k, v in os.environ.items() if k != "TRAINROOM_RUN"}
stranger = subprocess.Popen(["sleep", "300"], env=env)
with open(out, "w") as f:
    f.write(str(stranger.pid))
time.sleep(300)
"""
LEAVES_A_HELPER = """
import subprocess, sys
helper = subprocess.Popen([sys.executable, sys.argv[4], sys.argv[1], sys.argv[2]])
with open(sys.argv[3], "w") as f:
    f.write(str(helper.pid))
"""


def test_kill_of_a_leaderless_group_spares_a_stranger_and_takes_the_leftover(
    trhome: Path, tmp_path: Path
) -> None:
    script, helper_py = tmp_path / "t.py", tmp_path / "helper.py"
    script.write_text(LEAVES_A_HELPER)
    helper_py.write_text(HELPER)
    go, stranger_file, helper_file = tmp_path / "go", tmp_path / "stranger", tmp_path / "helper"
    info = launch(
        [sys.executable, str(script), str(go), str(stranger_file), str(helper_file), str(helper_py)],
        LaunchOptions(linger_s=60),
        cwd=str(tmp_path),
    )
    wait_for(
        lambda: status(info)["state"] == "exited", timeout=60, what="the trainer exits, its helper stays"
    )
    helper = int(
        wait_for(lambda: helper_file.exists() and helper_file.read_text(), timeout=30, what="helper")
    )
    go.touch()
    stranger = int(
        wait_for(lambda: stranger_file.exists() and stranger_file.read_text(), timeout=30, what="s")
    )
    try:
        assert os.getpgid(stranger) == os.getpgid(helper) == status(info)["pgid"]
        c = KeeperClient(info.sock)
        plan = c.call("kill", {}, confirm=False)
        assert [m["pid"] for m in plan.plan["members"]] == [helper]
        (s,) = plan.plan["strangers"]
        assert s["pid"] == stranger and (
            "after the attempt ended" in s["why"] or "does not name this run" in s["why"]
        )
        r = c.call("kill", {"grace_s": 2, "expect": plan.plan}, confirm=True)
        assert r.ok, r.message
        assert not psutil.pid_exists(helper) or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
        assert psutil.Process(stranger).status() != psutil.STATUS_ZOMBIE  # untouched
    finally:
        for pid in (stranger, helper):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
