"""trainroom: a terminal control room for a PyTorch training run that outlives its shell.

The package's top is the trainer SDK (`trainroom.core.sdk`):

    import trainroom
    rep = trainroom.connect(lr=3e-4)  # a no-op outside a keeper
    rep.step(step, loss=loss.item())

Each name is loaded when first used (PEP 562): `import trainroom` imports neither Textual, Rich,
torch nor the CLI, and a trainer pays only for the names it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainroom.core.sdk import (
        CheckpointError,
        CheckpointWontFit,
        LrChange,
        NonFiniteTracer,
        NullReporter,
        ReplayRequest,
        Reporter,
        Saved,
        VerifiedCheckpoint,
        checkpoint_requested,
        connect,
        current,
        error_chain,
        latest_checkpoint,
        reimpose_lr,
        replay_request,
        replay_result,
        requested_from_argv,
        save_checkpoint,
        verified_checkpoints,
    )

# The release, in one place: pyproject.toml reads it from here (`[tool.setuptools.dynamic]`).
__version__ = "0.1.0"

# The names of trainroom.core.sdk.__all__, written out for the type checker (a test checks they agree).
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
    "__version__",
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("trainroom.core.sdk"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
