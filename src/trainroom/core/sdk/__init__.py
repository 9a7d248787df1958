"""The trainer SDK, one import path for every name a trainer uses:

    from trainroom.core import sdk
    rep = sdk.connect(lr=3e-4, vocab_size=50257)  # a no-op outside a keeper
    ...
    rep.step(step, loss=loss.item(), tokens=tokens_seen, grad_norm=gn, optimizer=opt)

and the optional helpers `sdk.save_checkpoint(state, step)` (quarantine, verify, promote),
`sdk.reimpose_lr(optimizer, scheduler, lr)` (after loading state on a resume) and
`sdk.NonFiniteTracer(model)` (names the first module whose output went non-finite). Nothing here
imports torch at module level: a trainer without a GPU, and the keeper, import it cheaply.
"""

from trainroom.core.ckpt.layout import (
    CheckpointError,
    VerifiedCheckpoint,
    latest_checkpoint,
    verified_checkpoints,
)
from trainroom.core.protocol import error_chain
from trainroom.core.sdk.lr import LrChange, reimpose_lr, requested_from_argv
from trainroom.core.sdk.replay import ReplayRequest, replay_request, replay_result
from trainroom.core.sdk.reporter import NullReporter, Reporter, connect, current
from trainroom.core.sdk.requests import checkpoint_requested
from trainroom.core.sdk.save import CheckpointWontFit, Saved, save_checkpoint
from trainroom.core.sdk.tracer import NonFiniteTracer

__all__ = [
    "CheckpointError",
    "CheckpointWontFit",
    "LrChange",
    "NonFiniteTracer",
    "NullReporter",
    "ReplayRequest",
    "Reporter",
    "Saved",
    "VerifiedCheckpoint",
    "checkpoint_requested",
    "connect",
    "current",
    "error_chain",
    "latest_checkpoint",
    "reimpose_lr",
    "replay_request",
    "replay_result",
    "requested_from_argv",
    "save_checkpoint",
    "verified_checkpoints",
]
