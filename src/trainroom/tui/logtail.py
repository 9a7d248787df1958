"""The trainer-log tail: a plain thread that follows `runs/<id>/trainer.log`.

No Textual here. It keeps the last lines in a bounded deque and hands the app the whole tail
(a tuple) when it grew, so the app's message can replace a stale one still queued. A log that
shrank (truncated or replaced) is read again from its end.
"""

from __future__ import annotations

import codecs
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

TAIL_LINES = 1000  # what the log panel can scroll back through
FIRST_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 1 << 20  # per poll: a trainer spewing output cannot make one read unbounded


def clean_line(raw: str) -> str:
    """What a terminal would show: the last carriage-return segment (progress bars), no tabs."""
    return raw.rsplit("\r", 1)[-1].replace("\t", "    ").rstrip()


class TrainerLogTail(threading.Thread):
    def __init__(
        self,
        path: str | os.PathLike[str],
        on_lines: Callable[[tuple[str, ...]], object],
        *,
        interval_s: float = 0.5,
        max_lines: int = TAIL_LINES,
    ) -> None:
        super().__init__(name="trainroom-log-tail", daemon=True)
        self.path = Path(path)
        self._on_lines = on_lines
        self._interval = interval_s
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._partial = ""
        self._offset = 0
        self._inode: int | None = None
        # Incremental: a UTF-8 character split across two polls is decoded whole.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stopping = threading.Event()

    def poll(self) -> bool:
        """Read what was appended since the last poll; True when the tail changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        reset = self._inode != st.st_ino or st.st_size < self._offset
        skip_first = False
        if reset:
            # first sight, a new file, or truncated: start again from near its end
            self._inode, self._partial = st.st_ino, ""
            self._decoder.reset()
            self._lines.clear()
            self._offset = max(st.st_size - FIRST_READ_BYTES, 0)
            skip_first = self._offset > 0
        start = self._offset
        if st.st_size - start > MAX_READ_BYTES:
            # it grew faster than we read: keep only the newest megabyte
            start, self._partial, skip_first = st.st_size - MAX_READ_BYTES, "", True
        if st.st_size == start:
            return reset
        try:
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(st.st_size - start)
        except OSError:
            return reset
        self._offset = start + len(data)
        text = self._partial + self._decoder.decode(data)
        parts = text.split("\n")
        self._partial = parts.pop()
        if skip_first and parts:
            parts.pop(0)  # we started mid-line
        self._lines.extend(clean_line(p) for p in parts)
        return True

    @property
    def lines(self) -> tuple[str, ...]:
        tail = tuple(self._lines)
        return (*tail, clean_line(self._partial)) if self._partial.strip() else tail

    def run(self) -> None:
        while not self._stopping.is_set():
            if self.poll():
                self._on_lines(self.lines)
            self._stopping.wait(self._interval)

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
