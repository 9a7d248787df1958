"""What the keeper asks of a running trainer: checkpoint now (a Slurm job's warning signal before
its time limit or a preemption).

    if sdk.checkpoint_requested():      # cheap: one stat of a file a second at most
        sdk.save_checkpoint(state, step)  # the keeper verifies it, then requeues the job

The request is a file in the run's directory (`checkpoint-request`, holding the request's id)
written by `trainroom launch` when the job's signal comes; each new id is answered once. In a
DDP job every task's trainer sees it; rank 0 usually saves (sharded saves: broadcast the flag
from rank 0 first, so every rank saves at the same step)."""

from __future__ import annotations

import os
import time
from pathlib import Path

REQUEST_NAME = "checkpoint-request"
ENV_RUN_DIR = "TRAINROOM_RUN_DIR"
MAX_ID = 64


class _Poll:
    last_t = float("-inf")
    seen: str | None = None


def checkpoint_requested(*, every_s: float = 1.0) -> bool:
    """True once for each new request (False outside a keeper, and between looks)."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return False
    now = time.monotonic()
    if now - _Poll.last_t < every_s:
        return False
    _Poll.last_t = now
    try:
        text = (Path(run_dir) / REQUEST_NAME).read_text(errors="replace")[:MAX_ID].strip()
    except OSError:
        return False
    if not text or text == _Poll.seen:
        return False
    _Poll.seen = text
    return True


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
