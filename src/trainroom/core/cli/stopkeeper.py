"""`trainroom stop-keeper RUN... | --ended`: end the keeper of a run whose trainer has ended.

A keeper stays after its trainer ends for its linger (or while a control room watches) so the run
can be resumed, verified or pruned; this ends it now. It refuses while a trainer runs: the keeper
is what supervises it (`trainroom kill RUN` stops the trainer first) — except an attached run's
(`trainroom attach`): its keeper detaches and leaves the trainer it adopted running, untouched. The journal and the
checkpoints stay: `status`, `events` and the control room read an ended run from its journal.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from trainroom.core.cli.errors import CliError
from trainroom.core.run import store as runs
from trainroom.core.run.client import current_state
from trainroom.core.run.live import trainer_runs
from trainroom.core.run.store import RunInfo

EXIT_WAIT_S = 10.0  # a keeper closes its journal and socket in well under a second


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "stop-keeper", help="end the keeper of a run whose trainer has ended (never one whose trainer runs)"
    )
    sp.add_argument("run", nargs="*", help="the runs (id, prefix or suffix, name)")
    sp.add_argument(
        "--ended", action="store_true", help="every run whose keeper stays after its trainer ended"
    )
    sp.set_defaults(func=cmd_stop_keeper)


def cmd_stop_keeper(args: argparse.Namespace) -> int:
    if bool(args.run) == bool(args.ended):
        raise CliError("stop-keeper: name the runs, or give --ended (not both)")
    if args.ended:
        targets = [r for r in runs.list_runs() if r.alive and not r.remote and not trainer_runs(r)]
        if not targets:
            print("no keeper stays after an ended trainer")
            return 0
    else:
        targets = [runs.resolve_run(spec) for spec in args.run]
    refused = 0
    for info in targets:
        ok, said = stop_keeper(info)
        print(f"{info.run_id}: {said}")
        refused += not ok
    return 1 if refused else 0


def stop_keeper(info: RunInfo) -> tuple[bool, str]:
    """SIGTERM to the run's keeper once its trainer is known to have ended; (done, what happened)."""
    if info.remote:
        return False, "refused: a run on another host (run stop-keeper there)"
    rec = runs.read_record(Path(info.run_dir))
    if not runs.keeper_alive(rec) or rec.keeper_pid is None:
        return True, "no keeper running (nothing to stop)"
    state, _alive = current_state(info)
    a = state.attempt
    if a is not None and a.alive and not a.attached:
        return False, (
            f"refused: its trainer runs (pid {a.pid}, attempt {a.n}); `trainroom kill {info.run_id}` stops it first"
        )
    pid = rec.keeper_pid
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)  # psutil checks the create time: never a reused pid
    except psutil.NoSuchProcess:
        return True, "its keeper had already exited"
    except psutil.Error as exc:
        return False, f"could not signal keeper pid {pid}: {exc}"
    deadline = time.monotonic() + EXIT_WAIT_S
    while runs.keeper_alive(rec) and time.monotonic() < deadline:
        time.sleep(0.05)
    if runs.keeper_alive(rec):
        return False, f"keeper pid {pid} was asked to exit (SIGTERM) and still runs after {EXIT_WAIT_S:.0f} s"
    if a is not None and a.alive and a.attached:
        # Detached: the trainer was never the keeper's child, and runs on untouched.
        return (
            True,
            f"keeper pid {pid} exited (detached); the attached trainer pid {a.pid} runs on, untouched",
        )
    return (
        True,
        f"keeper pid {pid} exited; the run's journal and checkpoints stay (`trainroom status {info.run_id}`)",
    )
