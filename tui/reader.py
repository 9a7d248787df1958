"""The keeper reader: a plain thread that folds live deltas into the run's state.

No Textual here (toolong's watcher is the model): the thread owns the link's blocking socket,
applies each batch of records under the lock the app renders under, and tells the app through
callbacks, which post small messages. A burst of batches costs one render: the app's message for
a change replaces the one still queued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trainroom.core.state import RunState

from .link import KeeperLink, close_link


class KeeperReader(threading.Thread):
    def __init__(
        self,
        link: KeeperLink,
        lock: threading.Lock,
        *,
        on_snapshot: Callable[[RunState], None],
        on_change: Callable[[], None],
        on_gone: Callable[[str, float], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="trainroom-keeper-reader", daemon=True)
        self.link = link
        self.lock = lock
        self._on_snapshot = on_snapshot
        self._on_change = on_change
        self._on_gone = on_gone
        self._clock = clock
        self._stopping = threading.Event()
        self.batches = 0
        self.records = 0

    def run(self) -> None:
        reason = "the keeper closed the connection"
        try:
            state = self.link.subscribe(client="tui")
            self._on_snapshot(state)
            for batch in self.link.records():
                if self._stopping.is_set():
                    return
                with self.lock:
                    for rec in batch:
                        state.apply(rec)
                self.batches += 1
                self.records += len(batch)
                self._on_change()
        except Exception as exc:  # KeeperGone, a reset socket, a bad frame: all mean "gone"
            reason = str(exc) or type(exc).__name__
        if not self._stopping.is_set():
            self._on_gone(reason, self._clock())

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        close_link(self.link)
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
