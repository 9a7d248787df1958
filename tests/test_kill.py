"""Kill a real process group: children, a SIGTERM-ignoring worker, a worker that left the group,
and each refusal (pgid <= 1, ours, the keeper's, PID reuse, no such group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from trainroom.core.kill import execute_kill, plan_kill

# The leader starts three workers and prints their pids once each has set up its signals:
# `plain` dies on SIGTERM, `stubborn` ignores it (so SIGKILL is needed), `detached` calls
# setsid() and so is no longer in the group (an async-save child that left it).
LEADER = r"""
import json, subprocess, sys
WORKER = '''
import os, signal, sys, time
role = sys.argv[1]
if role == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if role == "detached":
    os.setsid()
print("ready", flush=True)
time.sleep(600)
'''
roles = sys.argv[1:]
workers = {r: subprocess.Popen([sys.executable, "-c", WORKER, r], stdout=subprocess.PIPE, text=True) for r in roles}
for w in workers.values():
    assert w.stdout.readline().strip() == "ready"
print(json.dumps({r: w.pid for r, w in workers.items()}), flush=True)
import time
time.sleep(600)
"""


@dataclass
class Group:
    leader: subprocess.Popen[str]
    workers: dict[str, int]

    @property
    def start_time(self) -> float:
        return psutil.Process(self.leader.pid).create_time()

    @property
    def pids(self) -> list[int]:
        return [self.leader.pid, *self.workers.values()]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def spawn() -> Iterator:
    started: list[Group] = []

    def start(*roles: str) -> Group:
        leader = subprocess.Popen(
            [sys.executable, "-c", LEADER, *roles], stdout=subprocess.PIPE, text=True, process_group=0
        )
        assert leader.stdout is not None
        workers = json.loads(leader.stdout.readline())
        group = Group(leader, workers)
        started.append(group)
        return group

    yield start
    for group in started:  # never leave a process behind, whatever the test did
        for pid in group.pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        group.leader.wait(timeout=10)


def test_term_then_kill_reaches_every_member_and_the_detached_child(spawn) -> None:
    group = spawn("plain", "stubborn", "detached")
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time)
    assert plan.ok, plan.refusals
    by_pid = {m.pid: m for m in plan.members}
    assert set(by_pid) == set(group.pids)
    assert by_pid[group.workers["detached"]].in_group is False
    assert by_pid[group.workers["stubborn"]].in_group is True
    assert any("-c" in m.cmdline for m in plan.members)
    assert plan.as_dict()["ok"] is True

    lines: list[str] = []
    result = execute_kill(plan, grace_s=0.5, progress=lines.append)

    assert result.ok, result.message
    assert all(_gone(pid) for pid in group.pids)
    # The leader is our child and nobody reaped it yet: a zombie, and counted as gone.
    assert psutil.Process(group.leader.pid).status() == psutil.STATUS_ZOMBIE
    assert f"SIGTERM -> pgid {plan.pgid}" in result.signals
    assert f"SIGTERM -> pid {group.workers['detached']}" in result.signals
    assert f"SIGKILL -> pgid {plan.pgid}" in result.signals  # the stubborn worker outlived the grace
    assert result.before["members"] == 4 and result.after["members"] == 0
    assert result.vram_released is None and "driver view unavailable" in result.message
    assert any("SIGKILL" in line for line in lines)
    json.dumps(result.as_dict())  # JSON-able for Reply / ActionRecord


def test_vram_is_polled_until_released(spawn) -> None:
    group = spawn("plain")
    readings = iter([12 << 30, 12 << 30, 3 << 30, 400 << 20])
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time)
    result = execute_kill(
        plan,
        grace_s=2,
        vram_probe=lambda: next(readings),
        tolerance_bytes=512 << 20,
        vram_timeout_s=30,
        vram_poll_s=0.01,
    )
    assert result.ok and result.vram_released is True
    assert result.before["vram_bytes"] == 12 << 30
    assert result.after["vram_bytes"] == 400 << 20
    assert "VRAM 12.0 GiB -> 400 MiB" in result.message
    assert result.before["mem_available_bytes"] > 0


def test_vram_still_held_after_the_timeout_is_not_ok(spawn) -> None:
    group = spawn("plain")
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time)
    result = execute_kill(
        plan,
        grace_s=2,
        vram_probe=lambda: 2 << 30,
        tolerance_bytes=512 << 20,
        vram_timeout_s=0.2,
        vram_poll_s=0.05,
    )
    assert all(_gone(pid) for pid in group.pids)
    assert result.ok is False and result.vram_released is False
    assert "still holds 2.0 GiB" in result.message


def test_pid_reuse_is_refused_and_nothing_is_signalled(spawn) -> None:
    group = spawn("plain")
    fake_start = group.start_time - 1000.0  # the attempt's process started long before this one
    plan = plan_kill(group.leader.pid, group.leader.pid, fake_start)
    assert not plan.ok
    assert "PID was reused" in plan.refusals[0]
    result = execute_kill(plan, grace_s=0)
    assert result.ok is False and "PID was reused" in result.message
    assert not any(_gone(pid) for pid in group.pids)


def test_keepers_group_is_refused(spawn) -> None:
    group = spawn("plain")
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time, keeper_pid=group.workers["plain"])
    assert any("keeper's process group" in r for r in plan.refusals)


@pytest.mark.parametrize("pgid", [0, 1, -5])
def test_pgid_at_most_one_is_refused(pgid: int) -> None:
    plan = plan_kill(pgid, pgid, time.time())
    assert not plan.ok and f"refusing pgid {pgid}" in plan.refusals[0]


def test_our_own_group_is_refused() -> None:
    me = psutil.Process()
    plan = plan_kill(me.pid, os.getpgid(0), me.create_time())
    assert any("our own process group" in r for r in plan.refusals)


def test_a_group_with_no_live_members_is_refused() -> None:
    start = time.time()
    done = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    done.wait()
    plan = plan_kill(done.pid, done.pid, start)
    assert plan.refusals == [f"no such process group: pgid {done.pid} has no live members"]
