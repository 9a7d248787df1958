"""Waiting on conditions (never on bare sleeps) and tearing down what a test started."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil


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


def process_ended(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet counts as ended): a keeper's socket goes
    before its last journal writes (the final snapshot, its exit note), its process after them."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_runs_under(home: Path) -> None:
    from trainroom.core.run import store as runs

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
