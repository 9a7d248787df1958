"""Public name of the LR helpers (`trainroom.core.lr.reimpose_lr`); the code lives in
`trainroom.core.sdk.lr`. Nothing inside trainroom imports this module (a test checks)."""

from trainroom.core.sdk.lr import LrChange, reimpose_lr, requested_from_argv

__all__ = ["LrChange", "reimpose_lr", "requested_from_argv"]
