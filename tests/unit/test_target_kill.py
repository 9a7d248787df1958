"""A finding's targeted kill: the processes it names, each proven (start tick, uid, never the
keeper or the live trainer), with their descendants; a run's leftovers found by its marker; the
findings that carry targets and the ones that offer no key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.support.run_builder import RunBuilder
from tests.support.waiting import wait_for
from trainroom.core.findings import Target
from trainroom.core.health.context import WatchContext
from trainroom.core.health.host import duplicate_findings
from trainroom.core.health.watchdog import Watchdog
from trainroom.core.ops.kill import execute_kill
from trainroom.core.ops.target_kill import plan_target_kill
from trainroom.core.probes.leftovers import run_leftovers
from trainroom.core.probes.procs import start_ticks
from trainroom.core.samples import Duplicate
from trainroom.core.wire import protocol as p

# A parent that starts a child in a session of its own, then sleeps: the target and a descendant.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)
"""


@pytest.fixture
def marker() -> str:
    return f"r-target-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def family(marker: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    env = {**os.environ, "TRAINROOM_RUN": marker, "TRAINROOM_ATTEMPT": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        yield proc, child
    finally:
        for pid in (child, proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_targeted_kill_ends_the_target_and_its_descendants_and_nothing_else(
    family: tuple[subprocess.Popen[str], int], marker: str
) -> None:
    parent, child = family
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        target = Target(pids=[parent.pid], start_ticks=[start_ticks(parent.pid)], label=f"pid {parent.pid}")
        plan = plan_target_kill(target, keeper_pid=os.getpid(), run_id=marker)
        assert plan.ok and plan.pgid == 0
        assert sorted(m.pid for m in plan.members) == sorted([parent.pid, child])
        result = execute_kill(plan, grace_s=5.0)
        assert result.ok, result.message
        assert f"pid {parent.pid}" in result.message
        wait_for(lambda: _gone(child), timeout=30, what="the descendant gone")
        assert parent.wait(timeout=30) == -signal.SIGTERM
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_pid_that_names_another_process_by_now_is_refused(
    family: tuple[subprocess.Popen[str], int], marker: str
) -> None:
    parent, _ = family
    ticks = start_ticks(parent.pid)
    assert ticks is not None
    plan = plan_target_kill(
        Target(pids=[parent.pid], start_ticks=[ticks - 1]), keeper_pid=None, run_id=marker
    )
    assert not plan.ok and not plan.members
    assert "pid reused" in plan.strangers[0].why and "no process of it is proven killable" in plan.refusals[0]


def test_the_keeper_its_ancestors_and_the_live_trainer_are_never_targets(
    family: tuple[subprocess.Popen[str], int], marker: str
) -> None:
    parent, _ = family
    me = plan_target_kill(Target(pids=[os.getppid()]), keeper_pid=os.getpid(), run_id=marker)
    assert not me.ok and "the keeper, this process, init or their ancestor" in me.refusals[0]
    live = plan_target_kill(
        Target(pids=[parent.pid]), keeper_pid=None, run_id=marker, live_trainer={parent.pid}
    )
    assert not live.ok and "live trainer" in live.refusals[0]


def test_a_target_already_gone_leaves_only_the_vram_to_confirm(marker: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    plan = plan_target_kill(Target(pids=[proc.pid], label="the old one"), keeper_pid=None, run_id=marker)
    assert plan.nothing_left and "the old one is gone" in plan.refusals[0]


def test_leftovers_are_the_runs_processes_of_no_live_attempt(
    family: tuple[subprocess.Popen[str], int], marker: str
) -> None:
    parent, child = family
    found = wait_for(lambda: run_leftovers(marker, 0.0, None), timeout=30, what="leftovers")
    assert sorted(x.pid for x in found) == sorted([parent.pid, child])
    assert {x.attempt for x in found} == {1}
    assert run_leftovers(marker, 0.0, live_attempt=1) == []  # attempt 1's own processes
    assert len(run_leftovers(marker, 0.0, live_attempt=2)) == 2
    assert run_leftovers("r-nobody", 0.0, None) == []


def test_a_duplicate_trainer_targets_the_other_one_and_a_host_duplicate_offers_no_key() -> None:
    dup = Duplicate(kind="trainer", pids=[10, 20], others=[20], ours=10, cmdline=["python", "t.py"], cwd="/w")
    host = Duplicate(kind="host", pids=[30, 31], others=[31], name="ollama")
    trainer_f, host_f = duplicate_findings(WatchContext(duplicates=[dup, host]))
    assert trainer_f.action == "kill" and trainer_f.target == Target(
        pids=[20], label="pid 20, the other trainer"
    )
    assert host_f.action is None and host_f.target is None


def test_a_users_kill_ends_the_attempt_stopped_not_dead_within_its_deadline() -> None:
    b = RunBuilder()
    b.start()
    b.steps(5)
    b.apply(p.AttemptStopping(n=1, t=b.now, by="cli pid 7", until=b.now + 20))
    b.now += 3
    b.end(exit_signal=signal.SIGTERM)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "stopped" and "stopped by cli pid 7" in v.reason and v.findings == []


def test_an_end_after_the_kills_deadline_is_a_death_again() -> None:
    b = RunBuilder()
    b.start()
    b.steps(5)
    b.apply(p.AttemptStopping(n=1, t=b.now, by="cli pid 7", until=b.now + 20))
    b.now += 60
    b.end(exit_signal=signal.SIGKILL)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "dead" and [f.code for f in v.findings] == ["DEAD"]


def test_a_kill_target_that_only_lost_processes_is_still_the_confirmed_one() -> None:
    from trainroom.core.actions.registry import REGISTRY

    def target_of(action: str, plan: dict[str, object]) -> object:
        return REGISTRY[action].identity(REGISTRY[action].decode(plan))

    def narrowed(action: str, confirmed: object, now: object) -> bool:
        return REGISTRY[action].narrowed(confirmed, now)

    def plan(pgid: int, *members: tuple[int, int]) -> dict[str, object]:
        return {"pgid": pgid, "members": [{"pid": pid, "start_ticks": t} for pid, t in members]}

    confirmed = target_of("kill", plan(10, (10, 1), (11, 2)))
    # A rank that ended on its own since: the rest is signalled.
    assert narrowed("kill", confirmed, target_of("kill", plan(10, (10, 1))))
    assert narrowed("kill", confirmed, target_of("kill", plan(10)))
    # A process added, a pid reused (another start tick), another group: a change, refused.
    assert not narrowed("kill", confirmed, target_of("kill", plan(10, (10, 1), (11, 2), (12, 3))))
    assert not narrowed("kill", confirmed, target_of("kill", plan(10, (10, 1), (11, 9))))
    assert not narrowed("kill", confirmed, target_of("kill", plan(20, (10, 1))))

    # A prune goes on with what is still eligible of what was shown, and leaves out what became
    # eligible since; a shown path with other bytes (another checkpoint under its name), or
    # another root, is a change.
    def prune(root: str, *dirs: tuple[str, int]) -> dict[str, object]:
        return {"root": root, "delete": [{"path": d, "bytes": n} for d, n in dirs]}

    shown = target_of("prune", prune("/r", ("/r/a", 1), ("/r/b", 1)))
    assert narrowed("prune", shown, target_of("prune", prune("/r", ("/r/a", 1))))
    assert narrowed("prune", shown, target_of("prune", prune("/r", ("/r/a", 1), ("/r/b", 1), ("/r/c", 1))))
    assert not narrowed("prune", shown, target_of("prune", prune("/r", ("/r/a", 1), ("/r/b", 2))))
    assert not narrowed("prune", shown, target_of("prune", prune("/s", ("/r/a", 1), ("/r/b", 1))))
