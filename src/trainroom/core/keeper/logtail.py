"""What the trainer appended to trainer.log: log-line telemetry (steps, loss, lr, grad norm, read
by core/logformats' recognisers) and the last lines (a traceback there is the cause of a death).

Lines end at `\\n` or `\\r` (a progress bar redraws itself with `\\r`). A line longer than
MAX_LINE_BYTES is cut there and the rest of it skipped, so a trainer that writes megabytes without
a line end cannot grow the keeper's memory."""

from __future__ import annotations

import re
from pathlib import Path

from trainroom.core import protocol as p
from trainroom.core.logformats import LogStep, Recognition, recognition

READ_CHUNK = 1 << 20
KEEP_LINES = 400
MAX_LINE_BYTES = 64 << 10
_LINE_END = re.compile(rb"[\r\n]")

__all__ = ["LogStep", "LogTail"]


class LogTail:
    """Reads trainer.log from where it last stopped (the end of the file when created)."""

    def __init__(self, path: Path, pattern: str | None) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.recognition: Recognition = recognition(pattern)
        self._rest = b""
        self._skipping = False  # inside an over-long line, past its first MAX_LINE_BYTES
        self.lines: list[str] = []
        self._announced: str | None = None
        self._errors_told = 0

    @property
    def recogniser(self) -> str | None:
        """The recogniser that read a step (None before one did)."""
        return self.recognition.name if self.recognition.chosen is not None else None

    def records(self, attempt: int, t: float, steps: list[LogStep]) -> list[p.Record]:
        """What an uninstrumented attempt's steps become in the journal: the recogniser that read
        them (once), a warning for the first line a recogniser failed on, and each step."""
        out: list[p.Record] = []
        name = self.recogniser
        if steps and name is not None and name != self._announced:
            self._announced = name
            out.append(p.LogRecognised(t=t, attempt=attempt, name=name))
        r = self.recognition
        if r.errors and not self._errors_told:
            self._errors_told = r.errors
            why = f"a log recogniser failed on a line (the line was skipped, reading goes on): {r.last_error}"
            out.append(p.KeeperNote(t=t, message=why, kind="warning"))
        out += [p.Received(attempt=attempt, rank=0, t=t, msg=log_step(s, t)) for s in steps]
        return out

    def read(self, final: bool = False) -> list[LogStep]:
        """The steps in what was appended since the last read. `final`: the attempt ended, so
        an unfinished last line is whole and what a recogniser held back is given out."""
        out: list[LogStep] = []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        if data:
            out += self._split(data)
        if final:
            if self._rest:
                out += self._line(self._rest)
            self._rest, self._skipping = b"", False
            out += self.recognition.end()
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
