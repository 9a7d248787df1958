"""Deprecated path: `from trainroom.core import reporter` (the README before the SDK moved).

A trainer instrumented by that README keeps running: `reporter.connect(...)` and the other names are
the SDK's own; importing this module warns once and names the new path, `import trainroom`.
Nothing inside trainroom imports it (the layer contracts in pyproject.toml).
"""

import warnings

from trainroom.core.sdk.reporter import NullReporter, Reporter, connect, current
from trainroom.core.wire.protocol import error_chain

__all__ = ["NullReporter", "Reporter", "connect", "current", "error_chain"]

warnings.warn(
    "trainroom.core.reporter is deprecated: use `import trainroom` and trainroom.connect(...) "
    "(trainroom.current, trainroom.Reporter, ... alike)",
    DeprecationWarning,
    stacklevel=2,
)
