"""Shared fixtures: a short private state dir per test, and clean-up of every keeper and trainer
a test started (by the pids the run records and journals name, so nothing is left running)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import kill_runs_under


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
        kill_runs_under(home)
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


ROOT = Path(__file__).resolve().parent
_DIR_MARKS = {"e2e": ("e2e",), "tui": ("tui",)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark by folder: tests/e2e are `e2e` (real keepers and trainers), tests/tui are `tui`
    (and their tmux tests `e2e` too), so `pytest -m "not e2e"` is the fast loop."""
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT)
        for mark in _DIR_MARKS.get(rel.parts[0], ()):
            item.add_marker(mark)
        if rel.parts[0] == "tui" and rel.name == "test_e2e.py":
            item.add_marker("e2e")
