"""Public name of the checkpoint helpers (`trainroom.core.checkpoints.save_checkpoint`); the code
lives in `trainroom.core.sdk.save` and `trainroom.core.ckpt`. Nothing inside trainroom imports this
module (a test checks)."""

from trainroom.core.ckpt.layout import (
    CheckpointError,
    VerifiedCheckpoint,
    latest_checkpoint,
    verified_checkpoints,
)
from trainroom.core.sdk.save import CheckpointWontFit, Saved, save_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointWontFit",
    "Saved",
    "VerifiedCheckpoint",
    "latest_checkpoint",
    "save_checkpoint",
    "verified_checkpoints",
]
