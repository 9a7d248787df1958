"""Messages from the reader threads to the app: small dataclasses.

The two that can come in bursts (records folded, the log grew) carry nothing a newer one does not,
so each replaces its predecessor still in the queue (`can_replace`): a burst costs one render.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState

from .reader import KeeperReader


@dataclass
class Attached(Message):
    """The keeper's snapshot arrived: the state (and plot series) the reader now folds deltas into."""

    state: RunState
    series: Series
    reader: KeeperReader | None = None  # which reader sent it: one stopped meanwhile is not heard


@dataclass
class RunChanged(Message):
    """Records were folded. `urgent`: something other than steps, heartbeats and probe samples
    came (a verdict, a finding, an attempt, a checkpoint): drawn at once, where routine
    telemetry waits for the next routine frame. A burst collapses to one render."""

    urgent: bool = False

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunChanged) and (self.urgent or not message.urgent)


@dataclass
class KeeperLost(Message):
    reason: str
    t: float
    reader: KeeperReader | None = None


@dataclass
class LogTailChanged(Message):
    lines: tuple[str, ...]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LogTailChanged)
