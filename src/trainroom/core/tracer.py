"""Deprecated path: `trainroom.core.tracer.NonFiniteTracer` (the README before the SDK moved).

Importing this module warns once and names the new path, `trainroom.NonFiniteTracer`. Nothing
inside trainroom imports it (the layer contracts in pyproject.toml).
"""

import warnings

from trainroom.core.sdk.tracer import NonFiniteTracer

__all__ = ["NonFiniteTracer"]

warnings.warn(
    "trainroom.core.tracer is deprecated: use trainroom.NonFiniteTracer",
    DeprecationWarning,
    stacklevel=2,
)
