"""Deprecated path: `trainroom.core.protocol` (the wire protocol, documented before the core's
single modules became packages). It moved to `trainroom.core.wire.protocol`.

Importing this module warns once and names the new path; every name resolves to the new module's
own object. Nothing inside trainroom imports it (the layer contracts in pyproject.toml).
"""

import warnings
from typing import Any

from trainroom.core.wire import protocol as _protocol

warnings.warn(
    "trainroom.core.protocol is deprecated: use trainroom.core.wire.protocol",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_protocol, name)


def __dir__() -> list[str]:
    return dir(_protocol)
