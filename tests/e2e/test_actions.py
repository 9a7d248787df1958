"""Actions you can trust: what runs is what was confirmed, and only processes proven the run's are
ever signalled. Real keepers, real trainers, real strangers."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import psutil

from tests.support.helpers import run_cli, start_demo, status, status_json
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p


def _verified(info: runs.RunInfo) -> int:
    return sum(1 for c in status(info)["checkpoints"] if c["state"] == "verified")


def test_a_prune_confirmed_on_a_live_run_deletes_exactly_what_was_confirmed(trhome: Path) -> None:
    info = start_demo(ckpt_every=5, step_delay=0.05)
    wait_for(lambda: _verified(info) >= 4, timeout=120, what="four verified checkpoints")
    c = KeeperClient(info.sock)
    plan = c.call("prune", {"keep": 2}, confirm=False)
    assert plan.stage == "plan"
    shown = {d["path"] for d in plan.plan["delete"]}
    assert shown
    # The run goes on saving while the plan is read: more become eligible before the yes.
    wait_for(lambda: _verified(info) >= 4 + len(shown) + 2, timeout=120, what="more checkpoints")
    # A confirmed checkpoint with other bytes under its name is another checkpoint: refused,
    # with the difference, and nothing deleted on the strength of it.
    first = plan.plan["delete"][0]
    forged = {**plan.plan, "delete": [{**first, "bytes": first["bytes"] + 1}, *plan.plan["delete"][1:]]}
    r = c.call("prune", {"keep": 2, "expect": forged}, confirm=True)
    assert not r.ok and "the target changed since it was confirmed" in r.message, r.message
    assert f"{first['path']} was" in r.message
    assert not [x for x in status(info)["checkpoints"] if x["state"] == "pruned"]
    # A confirmation without the plan it confirms is refused too.
    r = c.call("prune", {"keep": 2}, confirm=True)
    assert not r.ok and "args.expect" in r.message
    # The plan that was read: exactly its checkpoints go; those eligible since stay, named.
    r = c.call("prune", {"keep": 2, "expect": plan.plan}, confirm=True)
    assert r.ok, r.message
    deleted = {d["path"] for d in r.after["deleted"]}
    assert deleted == shown
    arrived = {d["path"] for d in r.after["arrived_since"]}
    assert arrived and not arrived & shown
    assert all(os.path.isdir(a) for a in arrived)
    assert not any(os.path.exists(d) for d in shown)
    assert f"{len(arrived)} eligible since the confirmation, not deleted" in r.message
    pruned = {x["step"] for x in status(info)["checkpoints"] if x["state"] == "pruned"}
    assert pruned == {d["step"] for d in plan.plan["delete"]}


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


STEPPER = """
import time
from trainroom.core import sdk
rep = sdk.connect(lr=1e-3)
step = 0
while True:
    step += 1
    rep.step(step, loss=2.0)
    time.sleep(0.05)
"""


def test_a_trainer_that_outlives_its_keeper_is_orphaned_and_killable_without_it(
    trhome: Path, tmp_path: Path
) -> None:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    info = launch([sys.executable, str(script)], LaunchOptions(linger_s=60), cwd=str(tmp_path))
    d = wait_for(lambda: (s := status(info)) and (s["step"] or 0) >= 3 and s, timeout=60, what="steps")
    trainer = d["pid"]
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    os.kill(keeper, signal.SIGKILL)
    d = wait_for(
        lambda: (s := status_json(info.run_id)) and s["keeper"] == "gone" and s, timeout=30, what="gone"
    )
    assert d["state"] == "orphaned" and f"trainer pid {trainer} still running" in d["state_reason"]
    out = run_cli("kill", info.run_id, "--yes", "--grace", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "without a keeper" in out.stdout
    wait_for(
        lambda: not psutil.pid_exists(trainer) or psutil.Process(trainer).status() == "zombie", timeout=30
    )
    (rec,) = _kills(info)
    assert rec.ok and rec.client == "cli-without-keeper" and trainer in rec.before.get("pids", [])


def _kills(info: runs.RunInfo) -> list[p.ActionRecord]:
    return [r for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.ActionRecord)]


def test_a_stopped_trainer_can_be_dumped_and_continued(trhome: Path) -> None:
    info = start_demo(fault="hang", fault_step=20, step_delay=0.02, ckpt_every=0)
    wait_for(lambda: status(info)["state"] == "hung", timeout=120, what="hung")
    out = run_cli("dump", info.run_id, "--json", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout)
    assert r["after"]["method"] == "py-spy" and "without pausing" in r["message"] and r["after"]["stopped"]
    assert r["message"].startswith(f"pid {status(info)['pid']} is stopped (SIGSTOP)"), r["message"]
    assert "continue (U) lets it run on" in r["message"]
    assert "MainThread" in r["after"]["stacks"]
    out = run_cli("continue", info.run_id, "--yes", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    d = wait_for(lambda: (s := status(info))["state"] == "running" and s, timeout=60, what="running again")
    wait_for(lambda: (status(info)["step"] or 0) > 20, timeout=60, what="steps after SIGCONT")
    assert d["keeper"] == "alive"


def _verifier(info: runs.RunInfo) -> psutil.Process:
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    for child in psutil.Process(keeper).children():
        if "--serve" in child.cmdline():
            return child
    raise AssertionError("no warm verifier")


def test_resume_right_after_a_death_waits_for_the_checkpoint_in_the_verifier(trhome: Path) -> None:
    info = start_demo(fault="silent-death", fault_step=31, ckpt_every=10, step_delay=0.05)
    wait_for(lambda: _verified(info) >= 1, timeout=120, what="a verified checkpoint (the verifier is warm)")
    verifier = _verifier(info)
    verifier.suspend()  # the step-30 checkpoint will sit in the verifier's queue
    try:
        d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=120, what="dead")
        assert d["step"] == 31  # it saved step 30, then died
        c = KeeperClient(info.sock)
        replies = []
        for r in c.request("resume", {}, confirm=False):
            replies.append(r)
            if r.stage == "progress" and "waiting for the verification" in r.message:
                verifier.resume()  # the verdict comes while the resume waits for it
        plan = replies[-1]
        assert any("waiting for the verification" in r.message for r in replies if r.stage == "progress")
        assert plan.stage == "plan" and plan.plan["step"] == 30, plan.message
    finally:
        if verifier.is_running():
            verifier.resume()


def _benches(home: Path) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (proc.info["environ"] or {}).get("TRAINROOM_HOME") == str(
                home
            ) and "trainroom.core.ops.bench" in " ".join(proc.info["cmdline"] or []):
                out.append(proc)
        except psutil.Error:
            continue
    return out


def test_a_long_bench_never_blocks_kill_and_can_be_cancelled(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    info = launch([sys.executable, str(script)], LaunchOptions(linger_s=60), cwd=str(tmp_path))
    wait_for(lambda: (status(info)["step"] or 0) >= 3, timeout=60, what="steps")
    replies: list[p.Reply] = []
    bench = threading.Thread(
        target=lambda: replies.extend(
            KeeperClient(info.sock).request("bench", {"device": "cpu", "seconds": 60}, confirm=True)
        ),
        daemon=True,
    )
    bench.start()
    wait_for(lambda: _benches(trhome), timeout=60, what="the bench running")
    # Kill is not blocked by the bench: its plan comes at once.
    plan = KeeperClient(info.sock).call("kill", {}, confirm=False)
    assert plan.stage == "plan" and plan.plan["members"]
    out = run_cli("cancel", "bench", info.run_id)
    assert out.returncode == 0, out.stdout + out.stderr
    bench.join(timeout=60)
    done = replies[-1]
    assert done.stage == "done" and not done.ok and "cancel" in done.message
    wait_for(lambda: not _benches(trhome), timeout=30, what="the bench's child gone")
    assert status(info)["state"] == "running"
