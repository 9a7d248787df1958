"""Messages from the reader threads and the action workers to the app: small dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState


@dataclass
class Attached(Message):
    """The keeper's snapshot arrived: the state (and plot series) the reader now folds deltas into."""

    state: RunState
    series: Series
    reader: object = None  # which reader sent it


@dataclass
class RunChanged(Message):
    """Records were folded. Carries nothing: a burst collapses to one render."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunChanged)


@dataclass
class KeeperLost(Message):
    reason: str
    t: float
    reader: object = None


@dataclass
class LogTailChanged(Message):
    lines: tuple[str, ...]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LogTailChanged)
