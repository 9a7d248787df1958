"""What the trainer appended to trainer.log: log-line telemetry (step, loss, lr by a regex with
named groups) and the last lines (a traceback there is the cause of a death)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

READ_CHUNK = 1 << 20
KEEP_LINES = 400


class LogStep(msgspec.Struct, frozen=True):
    step: int
    loss: float | None
    lr: float | None


class LogTail:
    """Reads trainer.log from where it last stopped (the end of the file when created)."""

    def __init__(self, path: Path, pattern: str) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.regex = re.compile(pattern)
        self._rest = b""
        self.lines: list[str] = []

    def read(self) -> list[LogStep]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self._rest + data
        *whole, self._rest = data.split(b"\n")
        out: list[LogStep] = []
        for raw in whole:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            step = self._parse(line)
            if step is not None:
                out.append(step)
        del self.lines[:-KEEP_LINES]
        return out

    def _parse(self, line: str) -> LogStep | None:
        m = self.regex.search(line)
        if m is None:
            return None
        g = m.groupdict()
        try:
            step = int(g["step"])
            loss = float(g["loss"]) if g.get("loss") is not None else None
            lr = float(g["lr"]) if g.get("lr") is not None else None
        except (KeyError, ValueError, TypeError):
            return None
        return LogStep(step, loss, lr)
