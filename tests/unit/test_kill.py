"""Kill a real process group: children, a SIGTERM-ignoring worker, a worker that left the group,
and each refusal (pgid <= 1, ours, the keeper's, PID reuse, no such group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from trainroom.core.ops.kill import execute_kill, plan_kill
from trainroom.core.ops.members import Lifetime, live_members
from trainroom.core.ops.vram import run_vram_probe
from trainroom.core.probes import procs
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario
from trainroom.core.probes.gpu import GpuProbe

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


RUN = "test-kill-run"


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
            [sys.executable, "-c", LEADER, *roles],
            stdout=subprocess.PIPE,
            text=True,
            process_group=0,
            env=dict(os.environ, TRAINROOM_RUN=RUN),  # the marker the keeper gives an attempt
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
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time, run_id=RUN)
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


def test_pid_reuse_is_refused_and_nothing_is_signalled(spawn) -> None:
    group = spawn("plain")
    fake_start = group.start_time - 1000.0  # the attempt's process started long before this one
    plan = plan_kill(group.leader.pid, group.leader.pid, fake_start, run_id=RUN)
    assert not plan.ok
    assert "PID was reused" in plan.refusals[0]
    result = execute_kill(plan, grace_s=0)
    assert result.ok is False and "PID was reused" in result.message
    assert not any(_gone(pid) for pid in group.pids)


def test_a_pid_reused_within_the_same_second_is_refused_by_its_start_tick(spawn) -> None:
    # The create time agrees to within the tolerance (a stranger that took the pid a moment
    # after the attempt started); the clock tick recorded at the start tells them apart.
    group = spawn("plain")
    ticks = procs.start_ticks(group.leader.pid)
    assert ticks is not None
    plan = plan_kill(
        group.leader.pid, group.leader.pid, group.start_time, attempt_start_ticks=ticks - 3, run_id=RUN
    )
    assert not plan.ok and "PID was reused" in plan.refusals[0] and f"tick {ticks}" in plan.refusals[0]
    assert execute_kill(plan, grace_s=0).ok is False
    assert not any(_gone(pid) for pid in group.pids)
    # The right tick is the same process: planned, members named with their own ticks.
    same = plan_kill(
        group.leader.pid, group.leader.pid, group.start_time, attempt_start_ticks=ticks, run_id=RUN
    )
    assert same.ok, same.refusals
    assert all(m.start_ticks is not None and m.start_ticks >= ticks for m in same.members)


def test_a_member_older_than_the_attempt_by_ticks_is_a_reused_group(spawn) -> None:
    group = spawn("plain")
    ticks = procs.start_ticks(group.leader.pid)
    assert ticks is not None
    # As if the attempt's leader had started later than every process now in the group.
    assert (
        live_members(
            group.leader.pid, Lifetime(run_id=RUN, start_time=group.start_time, start_ticks=ticks + 1000)
        )
        == []
    )
    assert group.leader.pid in live_members(
        group.leader.pid, Lifetime(run_id=RUN, start_time=group.start_time, start_ticks=ticks)
    )


def test_keepers_group_is_refused(spawn) -> None:
    group = spawn("plain")
    plan = plan_kill(
        group.leader.pid, group.leader.pid, group.start_time, keeper_pid=group.workers["plain"], run_id=RUN
    )
    assert any("keeper's process group" in r for r in plan.refusals)


@pytest.mark.parametrize("pgid", [0, 1, -5])
def test_pgid_at_most_one_is_refused(pgid: int) -> None:
    plan = plan_kill(pgid, pgid, time.time(), run_id=RUN)
    assert not plan.ok and f"refusing pgid {pgid}" in plan.refusals[0]


def test_our_own_group_is_refused() -> None:
    me = psutil.Process()
    plan = plan_kill(me.pid, os.getpgid(0), me.create_time(), run_id=RUN)
    assert any("our own process group" in r for r in plan.refusals)


def test_a_group_with_no_live_members_is_refused() -> None:
    start = time.time()
    done = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    done.wait()
    plan = plan_kill(done.pid, done.pid, start, run_id=RUN)
    assert plan.refusals == [f"no such process group: pgid {done.pid} has no live members of this run"]
    assert plan.empty and plan.nothing_left and plan.as_dict()["nothing_left"] is True


def test_nothing_left_still_confirms_the_driver_let_go(tmp_path: Path) -> None:
    # Scenario 1's death: the whole group died of SIGKILL, a context of its leader lingers.
    start = time.time()
    done = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    done.wait()
    plan = plan_kill(done.pid, done.pid, start, run_id=RUN)
    scenario = tmp_path / "nvml.json"
    write_scenario(
        scenario,
        {
            "devices": [RTX_3060 | {"used_bytes": 5 * GIB}],
            "processes": [{"pid": done.pid, "used_bytes": 5 * GIB}],
        },
    )
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [done.pid])
    held = execute_kill(plan, vram_probe=probe, vram_timeout_s=0.3, vram_poll_s=0.05)
    assert held.ok is False and held.vram_released is False and held.signals == []
    assert held.message.startswith(
        f"nothing left to kill: pgid {done.pid} has no live members; but the driver still holds 5.0 GiB"
    )
    write_scenario(scenario, {"devices": [RTX_3060 | {"used_bytes": 400 * MIB}], "processes": []})
    freed = execute_kill(plan, vram_probe=probe, vram_timeout_s=0.3, vram_poll_s=0.05)
    assert freed.ok and freed.vram_released is True and freed.after["members"] == 0
    assert "nothing left to kill" in freed.message


def test_a_refusal_other_than_an_empty_group_is_not_nothing_left(spawn) -> None:
    group = spawn("plain")
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time - 1000.0, run_id=RUN)
    assert not plan.ok and not plan.empty and not plan.nothing_left


GIB, MIB = 1 << 30, 1 << 20
RTX_3060 = {"name": "NVIDIA GeForce RTX 3060", "total_bytes": 12 * GIB, "util_percent": 100, "power_w": 60.0}


def _driver_releases_after_exit(path: Path, pids: list[int], released: dict) -> threading.Thread:
    """What the driver does once the processes are gone: the fake NVML scenario moves on."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        write_scenario(path, released)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_wsl_driver_view_uses_device_totals_12gb_to_400mib(spawn, tmp_path: Path) -> None:
    group = spawn("stubborn")
    scenario = tmp_path / "nvml.json"
    # WSL2: per-process memory is N/A (None), so the device total is the run's figure.
    write_scenario(
        scenario,
        {
            "devices": [
                RTX_3060
                | {"used_bytes": 12 * GIB, "processes": [{"pid": group.leader.pid, "used_bytes": None}]}
            ]
        },
    )
    driver = _driver_releases_after_exit(
        scenario, group.pids, {"devices": [RTX_3060 | {"used_bytes": 400 * MIB, "util_percent": 0}]}
    )

    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time, run_id=RUN)
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [m.pid for m in plan.members])
    result = execute_kill(plan, grace_s=0.3, vram_probe=probe, vram_timeout_s=30, vram_poll_s=0.05)
    driver.join(timeout=30)

    assert result.ok and result.vram_released is True, result.message
    assert result.before["vram_bytes"] == 12 * GIB and result.after["vram_bytes"] == 400 * MIB
    assert "VRAM 12.0 GiB -> 400 MiB" in result.message
    assert result.before["mem_available_bytes"] > 0 and result.after["mem_available_bytes"] > 0


def test_a_context_that_outlives_its_process_is_memory_not_released(spawn, tmp_path: Path) -> None:
    group = spawn("plain")
    scenario = tmp_path / "nvml.json"
    leader = group.leader.pid
    write_scenario(
        scenario,
        {
            "devices": [RTX_3060 | {"used_bytes": 9 * GIB}],
            "processes": [{"pid": leader, "used_bytes": 8 * GIB}],
        },
    )
    # After the exit the driver still lists a context for a pid that no longer exists here.
    orphan = {
        "devices": [RTX_3060 | {"used_bytes": 9 * GIB}],
        "processes": [{"pid": 4_000_000, "used_bytes": 8 * GIB}],
    }
    driver = _driver_releases_after_exit(scenario, group.pids, orphan)

    plan = plan_kill(leader, leader, group.start_time, run_id=RUN)
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [m.pid for m in plan.members])
    result = execute_kill(plan, grace_s=2, vram_probe=probe, vram_timeout_s=0.5, vram_poll_s=0.05)
    driver.join(timeout=30)

    assert all(_gone(pid) for pid in group.pids)
    assert result.before["vram_bytes"] == 8 * GIB
    assert result.ok is False and result.vram_released is False
    assert result.after["vram_bytes"] == 8 * GIB and "still holds 8.0 GiB" in result.message


def test_no_driver_reads_as_unavailable(spawn, tmp_path: Path) -> None:
    group = spawn("plain")
    scenario = tmp_path / "nvml.json"
    write_scenario(scenario, {"init_error": 12})  # NVML Shared Library Not Found
    plan = plan_kill(group.leader.pid, group.leader.pid, group.start_time, run_id=RUN)
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [group.leader.pid])
    result = execute_kill(plan, grace_s=2, vram_probe=probe, vram_timeout_s=5)
    assert result.ok and result.vram_released is None
    assert "driver view unavailable" in result.message


# An H200 with persistence mode, as measured: 615 MiB used with no process at all.
H200 = {"name": "NVIDIA H200", "total_bytes": 141 * GIB, "util_percent": 0, "power_w": 75.0}
H200_FLOOR = 615 * MIB


def test_a_615_mib_floor_with_per_process_rows_is_released_at_once(spawn, tmp_path: Path) -> None:
    # The trainer's row while it lives; once it is gone the driver lists no process, and the
    # device keeps its idle 615 MiB: nothing of the run is held, whatever the floor.
    group = spawn("plain")
    leader = group.leader.pid
    scenario = tmp_path / "nvml.json"
    write_scenario(
        scenario,
        {
            "devices": [H200 | {"used_bytes": H200_FLOOR + 1843 * MIB}],
            "processes": [{"pid": leader, "used_bytes": 1843 * MIB}],
        },
    )
    driver = _driver_releases_after_exit(
        scenario, group.pids, {"devices": [H200 | {"used_bytes": H200_FLOOR}], "processes": []}
    )
    plan = plan_kill(leader, leader, group.start_time, run_id=RUN)
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [m.pid for m in plan.members])
    # The product's own timeout: were the floor judged, this would wait 50 s and fail.
    result = execute_kill(plan, grace_s=2, vram_probe=probe, vram_timeout_s=50, vram_poll_s=0.05)
    driver.join(timeout=30)

    assert result.ok and result.vram_released is True, result.message
    assert result.vram_basis == "per-process" and result.after["vram_basis"] == "per-process"
    assert result.before["vram_bytes"] == 1843 * MIB and result.after["vram_bytes"] == 0
    assert result.after["vram_device_bytes"] == H200_FLOOR
    assert "judged on per-process rows: the driver lists no process of the run" in result.message
    assert "615 MiB is its own floor" in result.message


def test_without_per_process_memory_the_floor_recorded_at_launch_is_the_basis(spawn, tmp_path: Path) -> None:
    # MIG/WSL2: rows say N/A. The floor read before the trainer started is 615 MiB; after the
    # kill the device holds 700 MiB, over the absolute 512 MiB tolerance but 85 MiB above its floor.
    scenario = tmp_path / "nvml.json"
    write_scenario(scenario, {"devices": [H200 | {"used_bytes": H200_FLOOR}]})
    gpu = GpuProbe(FakeNvml(scenario))
    floor = gpu.floor()
    assert floor is not None and floor.used_bytes == [H200_FLOOR] and floor.per_process is None

    group = spawn("plain")
    leader = group.leader.pid
    write_scenario(
        scenario,
        {"devices": [H200 | {"used_bytes": 12 * GIB, "processes": [{"pid": leader, "used_bytes": None}]}]},
    )
    driver = _driver_releases_after_exit(
        scenario, group.pids, {"devices": [H200 | {"used_bytes": 700 * MIB}]}
    )
    plan = plan_kill(leader, leader, group.start_time, run_id=RUN)
    probe = run_vram_probe(gpu, [m.pid for m in plan.members], floor=floor)
    result = execute_kill(plan, grace_s=2, vram_probe=probe, vram_timeout_s=50, vram_poll_s=0.05)
    driver.join(timeout=30)

    assert result.ok and result.vram_released is True and result.vram_basis == "floor", result.message
    assert result.before["vram_bytes"] == 12 * GIB - H200_FLOOR
    assert result.after["vram_bytes"] == 85 * MIB and result.after["vram_floor_bytes"] == H200_FLOOR
    assert "against the floor recorded at launch" in result.message


def test_an_unreadable_process_list_is_not_an_empty_one(tmp_path: Path) -> None:
    # The driver gave rows before, but this time no ComputeRunningProcesses call answered: the
    # empty list proves nothing, so the device figure stands (and, with no floor, the tolerance).
    scenario = tmp_path / "nvml.json"
    write_scenario(
        scenario,
        {"devices": [H200 | {"used_bytes": 3 * GIB}], "processes": [{"pid": 4_000_001, "used_bytes": GIB}]},
    )
    gpu = GpuProbe(FakeNvml(scenario))
    probe = run_vram_probe(gpu, [4_000_001])
    first = probe()
    assert first is not None and not isinstance(first, int)
    assert first.basis == "per-process" and first.bytes == GIB
    broken = {"nvmlDeviceGetComputeRunningProcesses_v3": 999, "nvmlDeviceGetComputeRunningProcesses_v2": 999}
    broken["nvmlDeviceGetComputeRunningProcesses"] = 999
    write_scenario(scenario, {"devices": [H200 | {"used_bytes": 3 * GIB}], "errors": broken})
    second = probe()
    assert second is not None and not isinstance(second, int)
    assert second.basis == "device" and second.bytes == 3 * GIB


def test_a_cancel_ends_the_wait_for_vram_and_says_the_processes_are_gone(spawn, tmp_path: Path) -> None:
    group = spawn("plain")
    scenario = tmp_path / "nvml.json"
    leader = group.leader.pid
    write_scenario(
        scenario,
        {
            "devices": [RTX_3060 | {"used_bytes": 9 * GIB}],
            "processes": [{"pid": leader, "used_bytes": 8 * GIB}],
        },
    )
    orphan = {
        "devices": [RTX_3060 | {"used_bytes": 9 * GIB}],
        "processes": [{"pid": 4_000_000, "used_bytes": 8 * GIB}],
    }
    driver = _driver_releases_after_exit(scenario, group.pids, orphan)
    plan = plan_kill(leader, leader, group.start_time, run_id=RUN)
    probe = run_vram_probe(GpuProbe(FakeNvml(scenario)), [m.pid for m in plan.members])
    lines: list[str] = []
    stop = threading.Event()

    def said(line: str) -> None:
        lines.append(line)
        if "s left" in line:
            stop.set()  # a client's cancel, on the first countdown line

    result = execute_kill(
        plan, grace_s=2, vram_probe=probe, vram_timeout_s=600, vram_poll_s=0.05, progress=said, stop=stop
    )
    driver.join(timeout=30)
    assert all(_gone(pid) for pid in group.pids)
    countdown = [x for x in lines if x.startswith("waiting for the driver to release VRAM")]
    assert countdown and countdown[0].endswith(" s left"), lines
    assert result.ok is False and result.after["vram_wait_cancelled"] is True
    assert result.message.startswith("cancelled the wait for VRAM after ")
    assert "processes of pgid" in result.message and "gone" in result.message
    assert "still holds 8.0 GiB for the run (release not confirmed)" in result.message
