"""The trainer SDK: every name a trainer uses, also given by the package's top (`import trainroom`):

    import trainroom
    rep = trainroom.connect(lr=3e-4, vocab_size=50257)  # a no-op outside a keeper
    ...
    rep.step(step, loss=loss.item(), tokens=tokens_seen, grad_norm=gn, optimizer=opt)

and the optional helpers `save_checkpoint(state, step)` (quarantine, verify, promote),
`reimpose_lr(optimizer, scheduler, lr)` (after loading state on a resume) and
`NonFiniteTracer(model)` (names the first module whose output went non-finite).

Each name loads its module when first used (PEP 562): a trainer that only reports never imports the
checkpoint code, and nothing here imports torch at module level (a trainer without a GPU, and the
keeper, import it cheaply).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainroom.core.ckpt.layout import (
        CheckpointError,
        VerifiedCheckpoint,
        latest_checkpoint,
        verified_checkpoints,
    )
    from trainroom.core.sdk.lr import LrChange, reimpose_lr, requested_from_argv
    from trainroom.core.sdk.replay import ReplayRequest, replay_request, replay_result
    from trainroom.core.sdk.reporter import NullReporter, Reporter, connect, current
    from trainroom.core.sdk.requests import checkpoint_requested
    from trainroom.core.sdk.save import CheckpointWontFit, Saved, save_checkpoint
    from trainroom.core.sdk.tracer import NonFiniteTracer
    from trainroom.core.wire.protocol import error_chain

# Each public name and the module that holds it; `__all__` lists the same names, written out for the
# type checker (tests/unit/test_public_names.py checks they agree).
WHERE: dict[str, str] = {
    "CheckpointError": "trainroom.core.ckpt.layout",
    "CheckpointWontFit": "trainroom.core.sdk.save",
    "LrChange": "trainroom.core.sdk.lr",
    "NonFiniteTracer": "trainroom.core.sdk.tracer",
    "NullReporter": "trainroom.core.sdk.reporter",
    "ReplayRequest": "trainroom.core.sdk.replay",
    "Reporter": "trainroom.core.sdk.reporter",
    "Saved": "trainroom.core.sdk.save",
    "VerifiedCheckpoint": "trainroom.core.ckpt.layout",
    "connect": "trainroom.core.sdk.reporter",
    "checkpoint_requested": "trainroom.core.sdk.requests",
    "current": "trainroom.core.sdk.reporter",
    "error_chain": "trainroom.core.wire.protocol",
    "latest_checkpoint": "trainroom.core.ckpt.layout",
    "reimpose_lr": "trainroom.core.sdk.lr",
    "replay_request": "trainroom.core.sdk.replay",
    "replay_result": "trainroom.core.sdk.replay",
    "requested_from_argv": "trainroom.core.sdk.lr",
    "save_checkpoint": "trainroom.core.sdk.save",
    "verified_checkpoints": "trainroom.core.ckpt.layout",
}

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


# The package's modules, reachable as attributes (`sdk.reporter`) as when this file imported them.
SUBMODULES = ("lr", "replay", "reporter", "requests", "save", "tracer")


def __getattr__(name: str) -> Any:
    where = WHERE.get(name)
    if where is None:
        if name in SUBMODULES:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
