"""The keeper never goes blind: a full disk under its state dir, a damaged journal, a busy socket,
hostile or careless peers on the socket. Every test drives a real keeper process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import status
from tests.support.waiting import kill_runs_under, wait_for
from trainroom.core import protocol as p
from trainroom.core.run import store as runs
from trainroom.core.run.journal import read_journal
from trainroom.core.run.launch import launch
from trainroom.core.settings import LaunchOptions

# An instrumented trainer that never prints (its stdout is a file on the disk we fill) and steps
# until told to stop.
STEPPER = """
    import time
    from trainroom.core import reporter
    rep = reporter.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        time.sleep(0.05)
"""


def _launch_stepper(tmp_path: Path, **options: Any) -> runs.RunInfo:
    script = tmp_path / "stepper.py"
    script.write_text(textwrap.dedent(STEPPER))
    return launch([sys.executable, str(script)], LaunchOptions(linger_s=120, **options), cwd=str(tmp_path))


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _journal(info: runs.RunInfo) -> list[p.Record]:
    return list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TRAINROOM_HOME on a 16 MiB tmpfs of its own: a real filesystem this test can fill."""
    home = Path(tempfile.mkdtemp(prefix="trf", dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(home)], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip() or done.returncode}")
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    try:
        yield home
    finally:
        kill_runs_under(home)
        subprocess.run(["umount", "-l", str(home)], check=False)
        shutil.rmtree(home, ignore_errors=True)


def _fill(path: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC, nothing else


def test_a_full_state_disk_keeps_the_keeper_watching_and_loses_nothing(
    small_home: Path, tmp_path: Path
) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 5, timeout=60, what="steps")
    filler = small_home / "filler"
    _fill(filler)
    # The keeper says it cannot write, with the errno, and goes on watching from memory.
    d = wait_for(
        lambda: (s := status(info)) and _finding(s, "JOURNAL_WRITE_FAILED") and s,
        timeout=60,
        what="JOURNAL_WRITE_FAILED",
    )
    f = _finding(d, "JOURNAL_WRITE_FAILED")
    assert f is not None and f["evidence"]["errno"] == 28 and "ENOSPC" in f["message"]
    steps_while_full = d["step"]
    wait_for(lambda: status(info)["step"] > steps_while_full + 5, timeout=60, what="steps flowing while full")
    # The trainer's death is seen at once, disk or no disk.
    trainer = d["pid"]
    os.kill(trainer, signal.SIGKILL)
    dead = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=30, what="dead")
    assert dead["keeper"] == "alive" and _finding(dead, "DEAD") is not None
    # Space comes back: the backlog is written, the finding clears.
    filler.unlink()
    wait_for(lambda: _finding(status(info), "JOURNAL_WRITE_FAILED") is None, timeout=60, what="cleared")
    recs = _journal(info)
    assert not [r for r in recs if isinstance(r, p.JournalDamaged)], "the journal holds a torn record"
    ended = [r for r in recs if isinstance(r, p.AttemptEnded)]
    assert [e.exit_signal for e in ended] == [signal.SIGKILL]
    raised = [r.finding.code for r in recs if isinstance(r, p.FindingRaised)]
    assert "DEAD" in raised and "JOURNAL_WRITE_FAILED" in raised
    steps = [r.msg.step for r in recs if isinstance(r, p.Received) and isinstance(r.msg, p.Step)]
    assert steps == list(range(1, len(steps) + 1)), "a step record was lost while the disk was full"
    assert len(steps) > steps_while_full + 5


# --------------------------------------------------------------------------- the trainer side

# SIGPIPE at its default (as in a trainer launched from a shell that reset it, or a C++ extension
# that did): a write to a closed socket without MSG_NOSIGNAL kills the process with signal 13.
DEFAULT_SIGPIPE = """
    import os, signal, sys, time
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from trainroom.core import reporter
    rep = reporter.connect(lr=1e-3)
    out = open(sys.argv[1], "a", buffering=1)
    step = 0
    while not os.path.exists(sys.argv[2]):
        step += 1
        rep.step(step, loss=2.0)
        out.write(f"step {step}\\n")
        time.sleep(0.02)
    out.write("done\\n")
"""


def test_the_reporter_never_kills_blocks_or_raises_whatever_the_keeper_does(
    trhome: Path, tmp_path: Path
) -> None:
    """Keeper stopped, then killed, then its socket gone: the trainer (SIGPIPE at SIG_DFL) steps on
    and ends on its own."""
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent(DEFAULT_SIGPIPE))
    steps, stop = tmp_path / "steps.log", tmp_path / "stop"
    info = launch(
        [sys.executable, str(script), str(steps), str(stop)], LaunchOptions(linger_s=60), cwd=str(tmp_path)
    )
    rec = runs.read_record(Path(info.run_dir))
    assert rec.keeper_pid is not None

    def count() -> int:
        return (
            sum(1 for line in steps.read_text().splitlines() if line.startswith("step"))
            if steps.exists()
            else 0
        )

    wait_for(lambda: count() >= 10, timeout=60, what="steps")
    os.kill(rec.keeper_pid, signal.SIGSTOP)  # a stopped keeper: the socket fills, nothing reads
    try:
        n = count()
        wait_for(lambda: count() >= n + 300, timeout=120, what="steps while the keeper is stopped")
    finally:
        os.kill(rec.keeper_pid, signal.SIGCONT)
    trainer = status(info)["pid"]
    os.kill(rec.keeper_pid, signal.SIGKILL)  # gone mid-stream: the next send meets a closed socket
    n = count()
    wait_for(lambda: count() >= n + 50, timeout=60, what="steps after the keeper died")
    stop.touch()
    wait_for(
        lambda: steps.read_text().rstrip().endswith("done"), timeout=60, what="the trainer ends by itself"
    )
    wait_for(lambda: not Path(f"/proc/{trainer}").exists() or _state(trainer) == "Z", timeout=30, what="exit")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
