"""The keeper's "checkpoint now" (core/sdk/requests.py), answered through a Lightning Trainer:
`trainer.save_checkpoint` into the quarantine of the run's checkpoint root, where the SDK's
`save_checkpoint` writes a candidate (a temp name, then renamed), then reported, so the keeper
verifies and promotes it and a requeued attempt resumes from it
(`trainer.fit(..., ckpt_path=os.environ.get("TRAINROOM_RESUME"))`).

The integrations speak the SDK only (pyproject's contracts): the root's layout is not imported
here, so its two names are repeated below (tests/unit/test_lightning_request.py holds them equal
to core/ckpt/layout's, and has the keeper's verifier pass what is written)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from trainroom.core.ckpt.digest import digest_file
from trainroom.core.sdk.reporter import NullReporter, Reporter
from trainroom.core.sdk.requests import ENV_RUN_DIR, checkpoint_requested

SAVED_NOTE = "checkpoint-saved"
ENV_CKPT_ROOT = "TRAINROOM_CKPT_ROOT"  # the run's checkpoint root, set by the keeper
QUARANTINE = ".quarantine"  # core/ckpt/layout.QUARANTINE: where candidates are written


def candidate(root: Path, step: int) -> Path:
    """A free candidate name for `step` in the root's quarantine (`step-NNNNNN.ckpt`)."""
    q = root / QUARANTINE
    for i in range(1, 10_000):
        path = q / (f"step-{step:06d}.ckpt" if i == 1 else f"step-{step:06d}-{i}.ckpt")
        if not os.path.lexists(path):
            return path
    raise FileExistsError(f"no free candidate name for step {step} in {q}")


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
    """Save the trainer's full state as the candidate for `step`; rank 0 renames it into place
    and reports it with the note that answers the request. The candidate's path on rank 0, else
    None (and None without a checkpoint root: not under a keeper)."""
    root = os.environ.get(ENV_CKPT_ROOT)
    if not root:
        return None
    final = candidate(Path(root), step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"  # what a sweep removes if we die
    try:
        trainer.save_checkpoint(str(tmp))  # collective; the global rank 0 writes
        if not trainer.is_global_zero:
            return None
        size, digest = tmp.stat().st_size, digest_file(tmp)
        os.rename(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if reporter is not None:
        reporter.checkpoint(str(final), step, size, digest)
        reporter.note(SAVED_NOTE, f"saved at step {step} as the keeper asked: {final}", step=step)
    return final
