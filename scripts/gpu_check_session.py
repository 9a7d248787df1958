"""What scripts/gpu_check.py starts, kept so all of it can be ended: runs launched under a private
TRAINROOM_HOME (each a keeper and its trainer's process group), the pids their trainers spawned,
and a deadline every wait honours. The clean-up ends the runs' recorded groups and keepers
(`store.stop_run`), then any process whose environment still names that TRAINROOM_HOME (a child
that left its group, stopped or not)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run.client import KeeperGone, current_state
from trainroom.core.run.launch import launch
from trainroom.core.run.status import status_dict
from trainroom.core.run.store import RunError, RunInfo, stop_run

Status = dict[str, Any]  # status_dict: the `status --json` contract


class Session:
    def __init__(self, home: Path, budget_s: float, python: str) -> None:
        self.home = home
        self.python = python  # the interpreter the trainers run with
        self.deadline = time.monotonic() + budget_s
        self.run_dirs: list[str] = []
        self.pids: list[int] = []

    def left(self, cap: float) -> float:
        """How long a wait may take: its own cap, or what is left of the budget."""
        return max(0.0, min(cap, self.deadline - time.monotonic()))

    def launch(self, argv: list[str], options: LaunchOptions, cwd: Path) -> RunInfo:
        info = launch(argv, options, cwd=str(cwd))
        self.run_dirs.append(info.run_dir)
        return info

    def wait(self, info: RunInfo, pred: Callable[[Status], Any], cap: float) -> tuple[Any, Status]:
        """Poll the run's status until pred(status) is truthy, or the cap or the budget runs out:
        (what pred returned, or None; the last status read)."""
        end = time.monotonic() + self.left(cap)
        last: Status = {}
        while True:
            try:
                st, alive = current_state(info)
                last = status_dict(st, keeper_alive=alive)
                found = pred(last)
                if found:
                    return found, last
            except (KeeperGone, RunError):
                pass
            if time.monotonic() >= end:
                return None, last
            time.sleep(0.2)

    def wait_file(self, path: Path, cap: float) -> int | None:
        """The pid a spawned process wrote to `path` once ready (recorded for the clean-up)."""
        end = time.monotonic() + self.left(cap)
        while time.monotonic() < end:
            if path.exists():
                pid = int(path.read_text())
                self.pids.append(pid)
                return pid
            time.sleep(0.05)
        return None

    def cleanup(self) -> list[int]:
        """End everything started; the pids still alive afterwards (none, when it worked)."""
        for run_dir in self.run_dirs:
            stop_run(run_dir)
        for p in carrying(self.home):
            for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped straggler dies too
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        end = time.monotonic() + 15
        while True:
            alive = [p.pid for p in carrying(self.home)]
            if not alive or time.monotonic() >= end:
                return alive
            time.sleep(0.1)


def carrying(home: Path) -> list[psutil.Process]:
    """Live processes other than this one whose environment names this TRAINROOM_HOME (a zombie
    holds nothing: its parent reaps it)."""
    found = []
    for p in psutil.process_iter(["environ", "status"]):
        try:
            env = p.info["environ"] or {}
            if (
                env.get("TRAINROOM_HOME") == str(home)
                and p.info["status"] != "zombie"
                and p.pid != os.getpid()
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found
