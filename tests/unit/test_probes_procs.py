"""probes.procs against real processes: a zombie, a SIGSTOPped group, a parked and a busy main
thread, duplicates in one cwd, pidfd waits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from trainroom.core.probes import procs
from trainroom.core.probes.procs import (
    group_states,
    host_process_duplicates,
    process_state,
    read_stat,
    thread_activity,
    trainer_duplicates,
    wait_exit,
)
from trainroom.core.samples import Duplicate
from trainroom.core.wire.protocol import ProbeSample

SLEEPER = "import time; time.sleep(60)"


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Poll until pred() is truthy (a bound for a slow machine, not a measurement)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("start_new_session", True)
        kw.setdefault("stdout", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_real_zombie_is_state_z_and_has_exited(spawn) -> None:
    child = spawn([sys.executable, "-c", "pass"])
    # Not reaped: the child stays a zombie, which pid_exists still calls alive.
    wait_for(lambda: process_state(child.pid) == "Z", what="the zombie")
    assert psutil.pid_exists(child.pid)
    assert group_states(child.pid) == {child.pid: "Z"}
    assert wait_exit(child.pid, timeout=5.0) is True
    assert procs._wait_exit_polling(child.pid, timeout=5.0) is True
    child.wait()
    assert process_state(child.pid) is None
    assert wait_exit(child.pid, timeout=0.0) is True


def test_a_sigstopped_group_is_state_t(spawn) -> None:
    leader = spawn(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
        ]
    )
    members = wait_for(
        lambda: len(group_states(leader.pid)) == 2 and group_states(leader.pid), what="two members"
    )
    assert "T" not in members.values()  # S or R (a passing D while pages load is normal)
    os.killpg(leader.pid, signal.SIGSTOP)
    stopped = wait_for(
        lambda: set(group_states(leader.pid).values()) == {"T"} and group_states(leader.pid), what="state T"
    )
    assert leader.pid in stopped and len(stopped) == 2
    assert wait_exit(leader.pid, timeout=0.05) is False
    os.killpg(leader.pid, signal.SIGKILL)
    assert wait_exit(leader.pid, timeout=10.0) is True


def test_pidfd_wait_wakes_on_a_kill_and_falls_back_to_polling(spawn) -> None:
    child = spawn([sys.executable, "-c", SLEEPER])
    assert wait_exit(child.pid, timeout=0.05) is False
    assert procs._wait_exit_polling(child.pid, timeout=0.05) is False
    start = psutil.Process(child.pid).create_time()
    os.kill(child.pid, signal.SIGKILL)
    assert wait_exit(child.pid, timeout=10.0, start_time=start) is True


def test_a_parked_main_thread_stands_still_and_a_busy_one_moves(spawn) -> None:
    parked = spawn(
        [
            sys.executable,
            "-c",
            "import threading; l = threading.Lock(); l.acquire(); print('parked', flush=True); l.acquire()",
        ],
        stdout=subprocess.PIPE,
    )
    busy = spawn([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    assert parked.stdout is not None and parked.stdout.readline() == b"parked\n"

    def settled() -> int | None:
        # The thread's last switch into the lock wait counts too: wait until it has blocked.
        first = thread_activity(parked.pid)
        time.sleep(0.1)
        return first if process_state(parked.pid) == "S" and thread_activity(parked.pid) == first else None

    a0 = wait_for(settled, what="the parked thread to block")
    b0 = wait_for(lambda: thread_activity(busy.pid), what="busy activity")
    wait_for(lambda: thread_activity(busy.pid) != b0, what="the busy thread to run")
    time.sleep(0.3)  # a window in which the parked thread would have had to run
    assert thread_activity(parked.pid) == a0
    assert procs.group_activity([parked.pid, busy.pid, 2**22 + 1]).keys() == {parked.pid, busy.pid}


def test_duplicates_same_command_same_cwd_but_not_our_own_workers(spawn, tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "proj", tmp_path / "other"
    here.mkdir()
    elsewhere.mkdir()
    argv = [sys.executable, "-c", SLEEPER, "--run", str(tmp_path)]
    ours = spawn(argv, cwd=here)
    theirs = spawn(argv, cwd=here)
    spawn(argv, cwd=elsewhere)  # same command, another directory: not a duplicate
    for proc in (ours, theirs):
        wait_for(lambda proc=proc: psutil.Process(proc.pid).cmdline() == argv, what="the exec")
    dup = trainer_duplicates(argv, str(here), trainer_pid=ours.pid, own_pgid=ours.pid)
    assert dup is not None
    assert dup.ours == ours.pid and dup.others == [theirs.pid] and dup.pids == [ours.pid, theirs.pid]
    # With our attempt gone, the other one is still a duplicate of the command.
    dup = trainer_duplicates(argv, str(here), trainer_pid=None, own_pgid=ours.pid)
    assert dup is not None and dup.ours is None and dup.others == [theirs.pid]


def test_a_replay_of_this_run_is_no_duplicate_but_one_of_another_run_is(spawn, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", SLEEPER, "--run", str(tmp_path)]
    ours = spawn(argv, cwd=tmp_path)
    replay = spawn(argv, cwd=tmp_path, env={**os.environ, "TRAINROOM_REPLAY_OF": "run-a"})
    for proc in (ours, replay):
        wait_for(lambda proc=proc: psutil.Process(proc.pid).cmdline() == argv, what="the exec")
    assert (
        trainer_duplicates(argv, str(tmp_path), trainer_pid=ours.pid, own_pgid=ours.pid, run_id="run-a")
        is None
    )
    dup = trainer_duplicates(argv, str(tmp_path), trainer_pid=ours.pid, own_pgid=ours.pid, run_id="run-b")
    assert dup is not None and dup.others == [replay.pid]


def test_forked_workers_of_our_trainer_are_not_duplicates(spawn, tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import os, time; os.fork(); time.sleep(60)", "--run", str(tmp_path)]
    trainer = spawn(argv, cwd=tmp_path)
    wait_for(lambda: len(group_states(trainer.pid)) == 2, what="the forked worker")
    assert trainer_duplicates(argv, str(tmp_path), trainer_pid=trainer.pid, own_pgid=trainer.pid) is None


def test_two_instances_of_a_configured_host_process(spawn, tmp_path: Path) -> None:
    name = f"vmm{os.getpid() % 100000}"
    exe = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    first = spawn([str(exe), "60"])
    wait_for(lambda: psutil.Process(first.pid).name() == name, what="the exec")
    assert host_process_duplicates([name]) == []
    second = spawn([str(exe), "60"])
    found = wait_for(lambda: host_process_duplicates([name]), what="two instances")
    assert found == [
        Duplicate(
            kind="host", name=name, pids=sorted([first.pid, second.pid]), others=[max(first.pid, second.pid)]
        )
    ]


def test_read_stat_copes_with_spaces_and_parentheses_in_comm(tmp_path: Path) -> None:
    d = tmp_path / "123"
    d.mkdir()
    fields = ["S", "1", "123", "123"] + ["0"] * 15 + ["98765"] + ["0"] * 10
    (d / "stat").write_text("123 (we (i) rd) " + " ".join(fields) + "\n")
    st = read_stat(123, str(tmp_path))
    assert st is not None and st.comm == "we (i) rd" and st.state == "S" and st.pgid == 123
    assert st.start_ticks == 98765
    assert group_states(123, str(tmp_path)) == {123: "S"}
    assert read_stat(124, str(tmp_path)) is None


def test_a_sweep_of_a_real_sigstopped_trainer_reads_as_hung(spawn, tmp_path: Path, monkeypatch) -> None:
    from tests.support.run_builder import RunBuilder
    from trainroom.core.health.watchdog import Watchdog, context_from_probe
    from trainroom.core.keeper.supervision import targets_of
    from trainroom.core.probes import fake_nvml
    from trainroom.core.probes.sweep import ProbeSweep

    monkeypatch.setenv(fake_nvml.ENV, str(tmp_path / "gpu.json"))  # no file: a driver with no devices
    argv = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"]
    trainer = spawn(argv, cwd=tmp_path)
    wait_for(lambda: psutil.Process(trainer.pid).cmdline() == argv, what="the exec")
    b = RunBuilder()
    b.start(pid=trainer.pid)
    b.run.attempts[-1].argv, b.run.attempts[-1].cwd = argv, str(tmp_path)
    b.steps(30)
    sweep = ProbeSweep(lock_paths=[str(tmp_path / "train.lock")])
    wd = Watchdog()
    sample = sweep.sample(targets_of(b.run))
    assert sample.procs is not None and sample.gpu is not None and sample.host is not None
    assert sample.procs.states[trainer.pid] != "T" and trainer.pid in sample.procs.activity
    assert sample.procs.duplicates == [] and sample.gpu.available is True and sample.host.available
    # Typed samples travel as they are: the wire and a JSON round trip give back the same sample.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(sample), type=ProbeSample) == sample
    assert msgspec.json.decode(msgspec.json.encode(sample), type=ProbeSample) == sample
    b.apply(sample)
    v = wd.evaluate(b.run, context_from_probe(b.run.probe, alive=True), b.now)
    # (HOST_RAM_LOW would be this machine's truth, not the sweep's doing.)
    assert v.state == "running" and [f.code for f in v.findings if f.code != "HOST_RAM_LOW"] == []
    os.kill(trainer.pid, signal.SIGSTOP)
    wait_for(lambda: process_state(trainer.pid) == "T", what="state T")
    b.apply(sweep.sample(targets_of(b.run)))
    v = wd.evaluate(b.run, context_from_probe(b.run.probe, alive=True), b.now + 0.5)
    assert v.state == "hung" and any(f.code == "HUNG" and "state T" in f.message for f in v.findings)
    sweep.close()
