"""What the keeper asks of a running trainer: checkpoint now (a Slurm job's warning signal before
its time limit or a preemption).

    if sdk.checkpoint_requested():      # cheap: one stat of a file a second at most
        sdk.save_checkpoint(state, step)  # the keeper verifies it, then requeues the job

The request is a file in the run's directory (`checkpoint-request`, holding the request's id)
written by `trainroom launch` when the job's signal comes; each new id is answered once, and one
written before this process started is an earlier attempt's (a resumed or requeued run's new
trainer does not save again for it). In a
DDP job every task's trainer sees it; rank 0 usually saves (sharded saves: broadcast the flag
from rank 0 first, so every rank saves at the same step)."""

from __future__ import annotations

import os
import time
from pathlib import Path

REQUEST_NAME = "checkpoint-request"
ENV_RUN_DIR = "TRAINROOM_RUN_DIR"
MAX_ID = 64


def process_start() -> float:
    """When this process started (epoch seconds): /proc/self/stat's start tick after boot, else
    now (the first time it is asked)."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return btime + int(stat[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class _Poll:
    last_t = float("-inf")
    seen: str | None = None
    started: float | None = None  # this process's start (a request older than it is not ours)


def checkpoint_requested(*, every_s: float = 1.0) -> bool:
    """True once for each new request (False outside a keeper, and between looks)."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return False
    now = time.monotonic()
    if now - _Poll.last_t < every_s:
        return False
    _Poll.last_t = now
    if _Poll.started is None:
        _Poll.started = process_start()
    path = Path(run_dir) / REQUEST_NAME
    try:
        written = path.stat().st_mtime
        text = path.read_text(errors="replace")[:MAX_ID].strip()
    except OSError:
        return False
    if not text or text == _Poll.seen:
        return False
    _Poll.seen = text
    # btime is whole seconds: a second's slack, so a request made as this attempt began is answered
    return written >= _Poll.started - 1.0


def write_request(run_dir: str | os.PathLike[str], request_id: str) -> None:
    """Ask the trainer of the run at `run_dir` to checkpoint (atomically: write, then rename)."""
    path = Path(run_dir) / REQUEST_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(request_id[:MAX_ID])
    os.replace(tmp, path)


def current_request(run_dir: str | os.PathLike[str]) -> str | None:
    try:
        return (Path(run_dir) / REQUEST_NAME).read_text(errors="replace")[:MAX_ID].strip() or None
    except OSError:
        return None
