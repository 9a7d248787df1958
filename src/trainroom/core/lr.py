"""Deprecated path: `trainroom.core.lr.reimpose_lr` (the README before the SDK moved).

Importing this module warns once and names the new path, `trainroom.reimpose_lr`. Nothing inside
trainroom imports it (the layer contracts in pyproject.toml).
"""

import warnings

from trainroom.core.sdk.lr import LrChange, reimpose_lr, requested_from_argv

__all__ = ["LrChange", "reimpose_lr", "requested_from_argv"]

warnings.warn(
    "trainroom.core.lr is deprecated: use trainroom.reimpose_lr (and trainroom.LrChange, "
    "trainroom.requested_from_argv)",
    DeprecationWarning,
    stacklevel=2,
)
