"""Deprecated path: `trainroom.core.checkpoints.save_checkpoint` (the README before the SDK moved).

Importing this module warns once and names the new path, `trainroom.save_checkpoint`. Nothing
inside trainroom imports it (the layer contracts in pyproject.toml).
"""

import warnings

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

warnings.warn(
    "trainroom.core.checkpoints is deprecated: use trainroom.save_checkpoint (and "
    "trainroom.latest_checkpoint, trainroom.verified_checkpoints, ... alike)",
    DeprecationWarning,
    stacklevel=2,
)
