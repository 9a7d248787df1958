"""What the trainer appended to trainer.log: log-line telemetry (steps, loss, lr, grad norm, read
by core/logformats' recognisers) and the last lines (a traceback there is the cause of a death).

Lines end at `\\n` or `\\r` (a progress bar redraws itself with `\\r`). A line longer than
MAX_LINE_BYTES is cut there and the rest of it skipped, so a trainer that writes megabytes without
a line end cannot grow the keeper's memory.

The file is followed as `tail -F` follows it: truncated in place (logrotate's `copytruncate`), it
is read again from its start; renamed away with a new file in its place, the old one is read to
its end (the trainer's stdout may still write there) and the new one from its start once it has
something. More than MAX_BACKLOG unread (megabytes printed in one burst, before a crash or in one
endless line) is skipped to its last READ_CHUNK: the newest lines, a crash's traceback among them,
are what the keeper needs, and a reader that falls behind would call a live trainer stalled."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from trainroom.core import protocol as p
from trainroom.core.logformats import LogHints, LogStep, Recognition, recognition

READ_CHUNK = 1 << 20
KEEP_LINES = 400
MAX_LINE_BYTES = 64 << 10
MAX_BACKLOG = 4 * READ_CHUNK
MARK_BYTES = 64  # the bytes just before the offset: changed under it, the file was rewritten
# Lines an attempt may print with no step recognised before the run is told to pass a pattern.
UNRECOGNISED_LINES = 200
_LINE_END = re.compile(rb"[\r\n]")

__all__ = ["LogStep", "LogTail"]


class LogTail:
    """Reads trainer.log from where it last stopped (the end of the file when created)."""

    def __init__(self, path: Path, pattern: str | None, hints: LogHints | None = None) -> None:
        self.path = path
        self.offset = 0
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file held open
        self._mark = b""
        self._mark_at = 0
        # What happened to the file (truncated, rotated, a burst skipped): the keeper notes them.
        self.notices: list[str] = []
        self._open(at_end=True)
        self.recognition: Recognition = recognition(pattern, hints)
        self._rest = b""
        self._skipping = False  # inside an over-long line, past its first MAX_LINE_BYTES
        self.lines: list[str] = []
        self._announced: tuple[str, str] | None = None
        self._errors_told = 0
        self.unread = 0  # lines of this attempt read before any step was recognised
        self._unread_told = False

    @property
    def recogniser(self) -> str | None:
        """The recogniser that read a step (None before one did)."""
        return self.recognition.name if self.recognition.chosen is not None else None

    def records(self, attempt: int, t: float, steps: list[LogStep], rank: int = 0) -> list[p.Record]:
        """What an uninstrumented attempt's steps become in the journal: the recogniser that read
        them and its unit (again when either changes), once that nothing was recognised in the
        first UNRECOGNISED_LINES lines, a warning for the first line a recogniser failed on, and
        each step, filed under `rank` (the rank the attempt's workers say prints them: 0 for a
        single process)."""
        out: list[p.Record] = []
        name, unit = self.recogniser, self.recognition.unit
        if steps and name is not None and unit is not None and (name, unit) != self._announced:
            self._announced = (name, unit)
            out.append(p.LogRecognised(t=t, attempt=attempt, name=name, unit=unit))
        elif name is None and self.unread >= UNRECOGNISED_LINES and not self._unread_told:
            self._unread_told = True
            out.append(p.LogRecognised(t=t, attempt=attempt, name="none", lines=self.unread))
        r = self.recognition
        if r.errors and not self._errors_told:
            self._errors_told = r.errors
            why = f"a log recogniser failed on a line (the line was skipped, reading goes on): {r.last_error}"
            out.append(p.KeeperNote(t=t, message=why, kind="warning"))
        out += [p.Received(attempt=attempt, rank=rank, t=t, msg=log_step(s, t)) for s in steps]
        return out

    # ------------------------------------------------------------------ following the file

    def _open(self, at_end: bool = False) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        st = os.fstat(fd)
        self._close()
        self._fd, self._ident = fd, (st.st_dev, st.st_ino)
        self.offset = st.st_size if at_end else 0
        self._mark = os.pread(fd, min(MARK_BYTES, self.offset), self.offset - min(MARK_BYTES, self.offset))
        self._mark_at = self.offset
        return True

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None

    def _restart(self, why: str) -> None:
        """Read the file held again from its start: what was under the offset is gone."""
        self.notices.append(why)
        self.offset, self._mark, self._mark_at, self._rest, self._skipping = 0, b"", 0, b"", False

    def _replaced(self) -> bool:
        """Whether another file (with something in it) now has the path: a rename rotation."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) != self._ident and st.st_size > 0

    def _check(self, fd: int) -> None:
        """Truncation (the file shorter than the offset, or the bytes under it changed: it was
        truncated and written past the old offset between two reads), then a backlog to skip."""
        size = os.fstat(fd).st_size
        if size < self.offset:
            self._restart(
                f"{self.path.name} was truncated ({self.offset} -> {size} bytes): read again from its start"
            )
        elif (
            self._mark
            and self.offset >= len(self._mark)
            and self._mark_at == self.offset
            and (os.pread(fd, len(self._mark), self.offset - len(self._mark)) != self._mark)
        ):
            self._restart(f"{self.path.name} was rewritten under the reader: read again from its start")
        if size - self.offset > MAX_BACKLOG:
            skip_to = size - READ_CHUNK
            self.notices.append(
                f"{self.path.name}: {size - self.offset} unread bytes in one burst; skipped "
                f"{skip_to - self.offset} to read the newest {READ_CHUNK >> 20} MiB"
            )
            before = os.pread(fd, 1, skip_to - 1) if skip_to > 0 else b"\n"
            self.offset, self._rest = skip_to, b""
            self._skipping = _LINE_END.fullmatch(before) is None  # landed mid-line: skip to its end

    def _take(self) -> bytes:
        """What was appended since the last read (at most MAX_BACKLOG), following the file."""
        if self._fd is None and not self._open():
            return b""
        assert self._fd is not None
        self._check(self._fd)
        data = b""
        while len(data) < MAX_BACKLOG:
            chunk = os.pread(self._fd, READ_CHUNK, self.offset)
            self.offset += len(chunk)
            data += chunk
            if len(chunk) < READ_CHUNK:
                break
        if data:
            self._mark = (self._mark + data)[-MARK_BYTES:]
        self._mark_at = self.offset
        if len(data) < MAX_BACKLOG and self._replaced():
            self.notices.append(
                f"{self.path.name} was replaced (rotated): reading the new one from its start"
            )
            rest = data
            self._open()
            self._rest, self._skipping = b"", False
            return rest + b"\n" + self._take()
        return data

    def read(self, final: bool = False) -> list[LogStep]:
        """The steps in what was appended since the last read. `final`: the attempt ended, so
        an unfinished last line is whole and what a recogniser held back is given out."""
        out: list[LogStep] = []
        try:
            data = self._take()
        except OSError as exc:
            self.notices.append(f"{self.path.name} cannot be read: {exc.strerror or exc}")
            self._close()
            data = b""
        if data:
            out += self._split(data)
        if final:
            if self._rest:
                out += self._line(self._rest)
            self._rest, self._skipping = b"", False
            out += self.recognition.end()
            self.unread, self._unread_told = 0, False  # the next attempt is counted afresh
        elif self._rest:
            out += self.recognition.peek(self._rest.decode("utf-8", "replace"))
        del self.lines[:-KEEP_LINES]
        return out

    def _split(self, data: bytes) -> list[LogStep]:
        out: list[LogStep] = []
        start = 0
        for m in _LINE_END.finditer(data):
            piece = data[start : m.start()]
            start = m.end()
            if self._skipping:
                self._skipping = False
                continue  # the end of a line already cut and read
            out += self._line(self._rest + piece)
            self._rest = b""
        tail = data[start:]
        if self._skipping:
            return out
        self._rest += tail
        if len(self._rest) > MAX_LINE_BYTES:
            out += self._line(self._rest[:MAX_LINE_BYTES])
            self._rest, self._skipping = b"", True
        return out

    def _line(self, raw: bytes) -> list[LogStep]:
        if not raw.strip():
            return []  # `\r\n`, a bar's blank redraw
        line = raw[:MAX_LINE_BYTES].decode("utf-8", "replace")
        self.lines.append(line)
        if len(self.lines) > 2 * KEEP_LINES:
            del self.lines[:-KEEP_LINES]
        if self.recognition.chosen is None:
            self.unread += 1
        return self.recognition.feed(line)


def log_step(s: LogStep, t: float) -> p.Step:
    return p.Step(
        step=s.step,
        t=t,
        loss=s.loss,
        grad_norm=s.grad_norm,
        lr=[s.lr] if s.lr is not None else [],
        source="log",
    )
