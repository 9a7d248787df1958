"""Public name of the trainer SDK's reporter (`from trainroom.core import reporter`).

The code lives in `trainroom.core.sdk.reporter`; this module keeps the documented import working.
Nothing inside trainroom imports it (a test checks).
"""

from trainroom.core.protocol import error_chain
from trainroom.core.sdk.reporter import NullReporter, Reporter, connect, current

__all__ = ["NullReporter", "Reporter", "connect", "current", "error_chain"]
