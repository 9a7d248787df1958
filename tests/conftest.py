"""Shared fixtures: a short private state dir per test, and clean-up of every keeper and trainer
a test started (by the pids the run records and journals name, so nothing is left running)."""

from __future__ import annotations

import os
import shutil
import socket
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
        runs.stop_run(info.run_dir)
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


@pytest.fixture
def keeper_socket() -> Iterator[tuple[str, socket.socket]]:
    """A bare listening Unix socket in a short private dir (AF_UNIX paths must stay short)."""
    d = tempfile.mkdtemp(prefix="trs", dir="/tmp")
    path = os.path.join(d, "keeper.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    try:
        yield path, srv
    finally:
        srv.close()
        shutil.rmtree(d, ignore_errors=True)
