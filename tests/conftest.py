"""Shared fixtures: a short private state dir per test, and clean-up of every keeper and trainer
a test started (by the pids the run records and journals name, so nothing is left running)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parent))


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> Any:
    """Poll until `pred()` is truthy; fail with `what` after `timeout` (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or pred}; last value {last!r}")


def _kill_tree(home: Path) -> None:
    from trainroom.core import runs

    os.environ["TRAINROOM_HOME"] = str(home)
    for info in runs.list_runs():
        try:
            st = runs.load_state(info.run_dir)
        except Exception:
            continue
        for a in st.attempts:
            if a.pgid > 1:
                try:
                    os.killpg(a.pgid, signal.SIGCONT)
                    os.killpg(a.pgid, signal.SIGKILL)
                except OSError:
                    pass
        rec = runs.read_record(Path(info.run_dir))
        if rec.keeper_pid:
            try:
                p = psutil.Process(rec.keeper_pid)
                if rec.keeper_start_time and abs(p.create_time() - rec.keeper_start_time) < 1:
                    p.kill()
            except psutil.Error:
                pass
    # Anything else started with this home in its environment (duplicates, lock holders).
    for p in psutil.process_iter(["pid", "environ"]):
        try:
            env = p.info.get("environ") or {}
        except psutil.Error:
            continue
        if env.get("TRAINROOM_HOME") == str(home) and p.pid != os.getpid():
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture
def trhome(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short on purpose: the keeper's socket path must fit in sun_path (108 bytes).
    home = Path(tempfile.mkdtemp(prefix="tr", dir="/tmp"))
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    monkeypatch.delenv("TRAINROOM_FAKE_NVML", raising=False)
    try:
        yield home
    finally:
        _kill_tree(home)
        shutil.rmtree(home, ignore_errors=True)
