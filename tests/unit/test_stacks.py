"""Stack dumps from real python children: faulthandler on SIGUSR1 read back from the log, the
guard that never sends SIGUSR1 to a process that does not catch it, a stopped process, py-spy."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainroom.core.ops import stacks
from trainroom.core.ops.stacks import PY_SPY_INSTALL, StackDump, catches_signal, dump_stacks, extract_dump

# A trainer stand-in: a named worker thread, a main thread parked in `inner`, log lines on stdout
# interleaved with whatever faulthandler writes to stderr (both go to the one log file).
TRAINER = r"""
import faulthandler, signal, sys, threading, time
if sys.argv[1] == "instrumented":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
def loader():
    while True:
        time.sleep(0.05)
threading.Thread(target=loader, name="loader", daemon=True).start()
print("ready", flush=True)
def inner():
    for i in range(100000):
        print(f"iter {i}: loss 2.5", flush=True)
        time.sleep(0.2)
inner()
"""


def _started(code_and_args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`python -c CODE ARGS...` writing to `log`, once it has printed "ready"."""
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", *code_and_args], stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    while b"ready" not in log.read_bytes():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    return proc


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator:
    started: list[subprocess.Popen[bytes]] = []

    def start(kind: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{kind}.log"
        proc = _started([TRAINER, kind], log)  # the handler is registered before "ready"
        started.append(proc)
        return proc, log

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)


def test_faulthandler_dump_is_read_back_from_the_log(trainer) -> None:
    proc, log = trainer("instrumented")
    assert catches_signal(proc.pid, signal.SIGUSR1)
    result = dump_stacks(proc.pid, log, instrumented=True, timeout=10)
    assert result.ok and result.method == "faulthandler", result.message
    text = result.text
    assert text.startswith(("Thread 0x", "Current thread 0x"))
    assert "Current thread 0x" in text and " in inner" in text and " in loader" in text
    assert "iter " not in text  # the trainer's own log lines are not part of the block
    assert "2 thread(s)" in result.message
    assert proc.poll() is None  # SIGUSR1 did not kill it


PARKED = r"""
import faulthandler, signal, threading, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
threading.Thread(target=lambda: time.sleep(600), name="heartbeat", daemon=True).start()
lock = threading.Lock()
lock.acquire()
print("ready", flush=True)
lock.acquire()  # parked for good, as the hang-lock fault parks the training loop
"""


def _main_thread_switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/<pid>/task/<pid>/status")


def test_the_dump_does_not_wake_a_parked_main_thread(tmp_path: Path) -> None:
    # A signal to the process lands on the main thread, which leaves its futex wait (EINTR) and
    # sleeps again: the watchdog's activity view would then call a hang a stall. The dump goes to
    # another thread, so the main thread never runs.
    log = tmp_path / "parked.log"
    proc = _started([PARKED], log)
    try:
        while Path(f"/proc/{proc.pid}/task/{proc.pid}/stat").read_text().split(")")[1].split()[0] != "S":
            time.sleep(0.02)  # until the second acquire has put it to sleep
        before = _main_thread_switches(proc.pid)
        result = dump_stacks(proc.pid, log, instrumented=True, timeout=10)
        assert result.ok, result.message
        assert result.text.count("hread 0x") == 2 and " in <module>" in result.text
        assert _main_thread_switches(proc.pid) == before
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_second_dump_reads_only_the_new_block(trainer) -> None:
    proc, log = trainer("instrumented")
    first = dump_stacks(proc.pid, log, instrumented=True, timeout=10)
    size = log.stat().st_size
    second = dump_stacks(proc.pid, log, instrumented=True, timeout=10)
    assert first.ok and second.ok
    assert log.read_bytes()[size:].count(b"Current thread 0x") == 1


def test_sigusr1_is_never_sent_to_a_process_that_does_not_catch_it(
    trainer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proc, log = trainer("plain")
    assert not catches_signal(proc.pid, signal.SIGUSR1)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # and no py-spy to fall back on
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)  # nor one beside the interpreter
    result = dump_stacks(proc.pid, log, instrumented=True, timeout=2)
    assert result.ok is False
    assert "does not catch SIGUSR1" in result.message and "pip install py-spy" in result.message
    assert proc.poll() is None


def test_uninstrumented_without_py_spy_says_how_to_install_it(
    trainer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proc, log = trainer("plain")
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    result = dump_stacks(proc.pid, log, instrumented=False)
    assert result == StackDump(ok=False, text="", method=None, message=PY_SPY_INSTALL)


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (pip install py-spy)")
def test_uninstrumented_trainer_through_py_spy(trainer) -> None:
    proc, log = trainer("plain")
    result = dump_stacks(proc.pid, log, instrumented=False)
    reason = result.message.lower()
    if not result.ok and ("ptrace" in reason or "permission" in reason):
        pytest.skip(f"py-spy cannot attach here: {result['message']}")
    assert result.ok and result.method == "py-spy", result.message
    assert "inner" in result.text and "loader" in result.text


def test_stopped_trainer_is_not_signalled_and_the_reason_is_given(
    trainer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    proc, log = trainer("instrumented")
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "T":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    result = dump_stacks(proc.pid, log, instrumented=True, timeout=1)
    # Said stopped, with the fix, not a failure: nothing could read it here (no py-spy).
    assert result.ok is True and result.text == "" and result.stopped, result.message
    assert result.message.startswith(
        f"pid {proc.pid} is stopped (SIGSTOP): it runs no code until SIGCONT; continue (U) lets it run on; "
        "its stacks could not be read (py-spy is not installed"
    ), result.message
    # Nothing is pending for it: a SIGUSR1 sent now would fire whenever it is continued.
    status = Path(f"/proc/{proc.pid}/status").read_text()
    pending = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("ShdPnd:"))
    assert not pending >> (signal.SIGUSR1 - 1) & 1


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (pip install py-spy)")
def test_a_stopped_trainer_is_read_where_it_stopped(trainer) -> None:
    proc, log = trainer("plain")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        result = dump_stacks(proc.pid, log, instrumented=False)
        reason = result.message.lower()
        if "could not be read" in reason and ("ptrace" in reason or "permission" in reason):
            pytest.skip(f"py-spy cannot read it here: {result.message}")
        assert result.ok and result.method == "py-spy" and result.stopped, result.message
        assert result.message.startswith(f"pid {proc.pid} is stopped (SIGSTOP)"), result.message
        assert "its stacks where it stopped" in result.message and "inner" in result.text
        # plain text (sh gives py-spy a terminal unless told not to: it then colours its lines),
        # which the job's stack comparison reads
        from trainroom.core.job.actions import main_thread_frames

        assert "\x1b[" not in result.text, result.text[:300]
        frames = main_thread_frames(result.text)
        assert any(f.startswith("inner (") for f in frames), result.text
        assert all(f.split(" (", 1)[1].startswith(("/", "<")) for f in frames), frames
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_a_pid_that_is_gone() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    result = dump_stacks(done.pid, None, instrumented=True)
    assert result.ok is False and "is not running" in result.message


def test_extract_dump_skips_log_lines_around_the_block() -> None:
    log = (
        "iter 1: loss 2.5\n"
        "Thread 0x00007f8576ce86c0 (most recent call first):\n"
        '  File "/t.py", line 4 in worker\n'
        "\n"
        "Current thread 0x00007f8577a49b80 (most recent call first):\n"
        '  File "/t.py", line 7 in inner\n'
        "iter 2: loss 2.4\n"
    )
    text, ended = extract_dump(log)
    assert ended is True
    assert text.splitlines()[0].startswith("Thread 0x") and text.splitlines()[-1].endswith("in inner")
    assert "iter" not in text
    assert extract_dump("iter 1: loss 2.5\n") == ("", False)


PARKED_IN_LIB = r"""
import threading
print("ready", flush=True)
def parked():
    threading.Event().wait()
parked()
"""


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (pip install py-spy)")
def test_py_spy_frames_carry_full_file_names_so_the_trainers_own_frame_is_told_apart(tmp_path: Path) -> None:
    """Parked in the standard library (threading.Event.wait): with py-spy's default short names
    (`threading.py`) the library frame read as the trainer's own; full names, as faulthandler's,
    put the place where it waits in the trainer's code."""
    from trainroom.core.job.actions import main_thread_frames, parked_at

    log = tmp_path / "parked.log"
    proc = _started([PARKED_IN_LIB], log)
    try:
        result = wait_parked(proc.pid, log)
        if not result.ok and ("ptrace" in result.message.lower() or "permission" in result.message.lower()):
            pytest.skip(f"py-spy cannot read it here: {result.message}")
        frames = main_thread_frames(result.text)
        assert any("/threading.py:" in f for f in frames), frames  # the library's frame, full path
        assert parked_at(frames) == f"parked (<string>:5) → {frames[0].split(' (', 1)[0]}", frames
    finally:
        proc.kill()
        proc.wait(timeout=10)


def wait_parked(pid: int, log: Path) -> StackDump:
    """py-spy's dump once the main thread sits in the wait (its first frames may be its start)."""
    deadline = time.monotonic() + 30
    while True:
        result = dump_stacks(pid, log, instrumented=False)
        if not result.ok or "parked" in result.text or time.monotonic() > deadline:
            return result
        time.sleep(0.1)
