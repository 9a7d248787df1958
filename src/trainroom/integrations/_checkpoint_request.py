"""The keeper's "checkpoint now" (core/sdk/requests.py), answered through a Lightning Trainer:
`trainer.save_checkpoint` into the quarantine of the run's checkpoint root, as the SDK's
`save_checkpoint` writes a candidate (a temp name, then renamed, with its save-time record), then
reported, so the keeper verifies and promotes it and a requeued attempt resumes from it
(`trainer.fit(..., ckpt_path=os.environ.get("TRAINROOM_RESUME"))`)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from trainroom.core.ckpt import layout
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.sdk.reporter import NullReporter, Reporter
from trainroom.core.sdk.requests import ENV_RUN_DIR, checkpoint_requested

SAVED_NOTE = "checkpoint-saved"


def asked(trainer: Any) -> bool:
    """A new request from the keeper (at most one look a second). Under DDP every rank takes
    part (saving is collective): any rank asked is every rank asked. Nothing outside a keeper."""
    if not os.environ.get(ENV_RUN_DIR):
        return False
    mine = checkpoint_requested()
    if int(getattr(trainer, "world_size", 1) or 1) > 1:
        return bool(trainer.strategy.reduce_boolean_decision(mine, all=False))
    return mine


def save_asked(trainer: Any, step: int, reporter: Reporter | NullReporter | None) -> Path | None:
    """Save the trainer's full state as the candidate for `step`; rank 0 renames it into place,
    writes its record and reports it. The candidate's path on rank 0, else None."""
    q = layout.Quarantine(layout.checkpoint_root()).ensure()
    final = layout.unique_path(q / f"{layout.step_dir_name(step)}.ckpt")
    tmp = q / f".{final.name}.{os.getpid()}.tmp"
    try:
        trainer.save_checkpoint(str(tmp))  # collective; the global rank 0 writes
        if not trainer.is_global_zero:
            return None
        size, digest = tmp.stat().st_size, digest_file(tmp)
        layout.write_json_atomic(
            Path(str(final) + layout.SAVED_SUFFIX),
            layout.SaveRecord(
                step=step, size_bytes=size, digest=digest, saved_at=time.time(), pid=os.getpid()
            ),
        )
        os.rename(tmp, final)
        layout.fsync_dir(q)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if reporter is not None:
        reporter.checkpoint(str(final), step, size, digest)
        reporter.note(SAVED_NOTE, f"saved at step {step} as the keeper asked: {final}", step=step)
    return final
