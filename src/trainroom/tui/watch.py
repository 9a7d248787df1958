"""The threads that follow one run for the control room: the keeper reader and the log tail.

Both are plain threads (`reader.py`, `logtail.py`, no Textual); here they are started, replaced
and stopped, and their callbacks become messages to the app. A reconnect starts a new reader:
its messages name it, so one from a reader stopped meanwhile is not heard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from textual.message import Message

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState

from .link import KeeperLink
from .logtail import TrainerLogTail
from .messages import Attached, KeeperLost, LogTailChanged, RunChanged
from .reader import KeeperReader


class RunWatch:
    """`post` delivers a message to the app from any thread (`App.post_message`); `lock` is the
    one the app renders under, which the reader folds records under."""

    def __init__(
        self, post: Callable[[Message], object], lock: threading.Lock, clock: Callable[[], float]
    ) -> None:
        self._post = post
        self._lock = lock
        self._clock = clock
        self.link: KeeperLink | None = None  # the keeper's, while it is followed
        self._reader: KeeperReader | None = None
        self._log_tail: TrainerLogTail | None = None

    def tail_log(self, path: Path) -> None:
        """Follow the trainer's log; once: the file outlives keepers and attempts."""
        if self._log_tail is None:
            self._log_tail = TrainerLogTail(path, lambda lines: self._post(LogTailChanged(lines)))
            self._log_tail.start()

    def follow(self, link: KeeperLink) -> None:
        """Read the keeper behind `link` with a new reader (the last one is stopped first)."""
        self.drop_keeper()
        self.link = link
        reader: KeeperReader | None = None

        def on_snapshot(state: RunState, series: Series) -> None:
            self._post(Attached(state, series, reader))

        reader = KeeperReader(
            link,
            self._lock,
            on_snapshot=on_snapshot,
            on_change=lambda urgent: self._post(RunChanged(urgent)),
            on_gone=lambda reason, t: self._post(KeeperLost(reason, t, reader)),
            clock=self._clock,
        )
        self._reader = reader
        reader.start()

    def hears(self, reader: KeeperReader | None) -> bool:
        """Whether a message from `reader` is still news (it is the reader now following)."""
        return reader is self._reader

    def drop_keeper(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        self.link = None

    def stop(self) -> None:
        self.drop_keeper()
        if self._log_tail is not None:
            self._log_tail.stop()
            self._log_tail = None
