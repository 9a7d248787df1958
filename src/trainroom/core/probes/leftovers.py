"""Leftovers: live processes of this run that no live attempt owns — a straggler of a dead
attempt (a data-loader worker that called setsid, a stopped rank), still holding memory or a GPU
context. They are found by the run id the keeper puts in every attempt's environment
(TRAINROOM_RUN; children inherit it) and told from the live attempt's processes by
TRAINROOM_ATTEMPT. A targeted kill of GHOST_MEMORY / ORPHAN_CONTEXT signals exactly these."""

from __future__ import annotations

import os

import psutil

from trainroom.core.probes.procs import START_TIME_TOLERANCE_S, start_ticks
from trainroom.core.probes.runof import run_of
from trainroom.core.samples import Leftover


def run_leftovers(run_id: str, created: float, live_attempt: int | None) -> list[Leftover]:
    """Processes of our uid, started since the run was created, whose environment names this
    run and not its live attempt (`live_attempt` None: no attempt is alive, all are leftovers).
    Zombies hold nothing and are left out."""
    if not run_id:
        return []
    uid, me = os.getuid(), os.getpid()
    out: list[Leftover] = []
    for proc in psutil.process_iter(["uids", "create_time"]):
        try:
            info = proc.info
            if proc.pid == me or info["uids"] is None or info["uids"].real != uid:
                continue
            if info["create_time"] is None or info["create_time"] < created - START_TIME_TOLERANCE_S:
                continue
            found = run_of(proc.pid)
            if found is None or found.run != run_id:
                continue
            attempt = found.attempt
            if live_attempt is not None and attempt == live_attempt:
                continue
            state = proc.status()
            if state == psutil.STATUS_ZOMBIE:
                continue
            out.append(
                Leftover(
                    pid=proc.pid,
                    start_ticks=start_ticks(proc.pid),
                    attempt=attempt,
                    state=state,
                    cmdline=proc.cmdline()[:8],
                )
            )
        except (psutil.Error, OSError):
            continue
    return sorted(out, key=lambda x: x.pid)
