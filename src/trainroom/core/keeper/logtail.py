"""What the trainer appended to trainer.log: log-line telemetry (steps, loss, lr, grad norm, read
by core/logs/logformats' recognisers) and the last lines (a traceback there is the cause of a death).

Lines end at `\\n` or `\\r` (a progress bar redraws itself with `\\r`). Trainer output is hostile
data, so what the tick does with it is bounded whatever the trainer prints:
- a line longer than MAX_LINE_BYTES (4 KiB) is read to there, once, and the rest of it skipped to
  its line end (`truncated` counts such lines; the keeper says so once per attempt);
- an unfinished last line (a bar's redraw, or a line still being written) is kept with the offset
  and read once it ends or passes the bound; a bar redraw is peeked at once, never again each tick;
- each read recognises lines for at most its time budget (the keeper's tick gives READ_BUDGET_S)
  and leaves the rest for the next tick, so the tick, `status`, DEAD and `kill` stay prompt;
- an instrumented attempt's lines are kept (a traceback is a death's cause) but not recognised:
  its reporter's frames are exact.

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
import time
from pathlib import Path

from trainroom.core.logs.logformats import ANSI, LogHints, LogStep, Recognition, recognition
from trainroom.core.logs.loglines import PARSE_CHARS
from trainroom.core.logs.logtiming import Pace
from trainroom.core.wire import protocol as p

READ_CHUNK = 1 << 20
KEEP_LINES = 400
MAX_LINE_BYTES = PARSE_CHARS  # 4 KiB: what of a line is kept and read; the rest is skipped
# How long one tick's read may recognise lines before leaving the rest for the next tick; the final
# read of an ended attempt gets FINAL_BUDGET_S, then keeps the remaining lines unrecognised.
READ_BUDGET_S = 0.05
FINAL_BUDGET_S = 1.0
# A step read from the log past JUMP_FACTOR times the one before (and past JUMP_FLOOR) waits for a
# later line to go on from it before it is believed (class Jumps).
JUMP_FACTOR = 10
JUMP_FLOOR = 1000
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
        self.pace = Pace()  # the trainer's own timing on the lines steps are read from
        self._rest = b""
        self._skipping = False  # inside an over-long line, past its first MAX_LINE_BYTES
        self._buf = b""  # what was taken from the file and not yet cut into lines
        self._pos = 0
        self._peeked = False  # the unfinished last line was peeked at since it last changed
        self.truncated = 0  # lines cut at MAX_LINE_BYTES (this keeper's life)
        self._truncated_told = 0
        self._ended = False  # the last read was an attempt's final one
        self.deferred = 0  # reads that left lines for the next tick (their time budget spent)
        self.lines: list[str] = []
        self.times: list[float] = []  # when each of `lines` was read
        self._now = 0.0
        self._seen = 0  # lines read in all
        self._step_at = -1  # the index (of _seen) of the last line a new step was read from
        self._mark_step: int | None = None  # the step read from that line
        self._before_at = -1  # the index of the new-step line before it
        self.jumps = Jumps()
        self._announced: tuple[str, str] | None = None
        self._errors_told = 0
        self.unread = 0  # lines of this attempt read before any step was recognised
        self._unread_told = False

    @property
    def behind(self) -> bool:
        """Lines taken from the file are left for the next read (its time budget was spent)."""
        return self._pos < len(self._buf)

    @property
    def recogniser(self) -> str | None:
        """The recogniser that read a step (None before one did)."""
        return self.recognition.name if self.recognition.chosen is not None else None

    def collect(
        self, t: float, attempt: int | None, instrumented: bool, rank: int, final: bool = False
    ) -> list[p.Record]:
        """One read (keeper.read_log each tick; `final` once the attempt ended) as what the keeper
        journals: what happened to the file, then (an uninstrumented attempt) `records`. An
        instrumented attempt's lines are kept (a traceback) but not recognised: its reporter's
        frames are exact and log lines would double them."""
        steps = self.read(final, recognise=not instrumented)
        out: list[p.Record] = [p.KeeperNote(t=t, message=why, kind="warning") for why in self.notices]
        self.notices.clear()
        if attempt is None or instrumented:
            return out
        return out + self.records(attempt, t, steps, rank=rank)

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
        # Said at the first cut line and again, with the count, once the attempt has ended.
        if self.truncated > self._truncated_told and (not self._truncated_told or self._ended):
            self._truncated_told = self.truncated
            out.append(p.KeeperNote(t=t, message=self.truncated_words(), kind="warning"))
        steps = self.jumps.take(steps)
        if self._ended:
            self.jumps.end()
        out += [p.KeeperNote(t=t, message=why, kind="warning") for why in self.jumps.notes]
        self.jumps.notes.clear()
        out += [p.Received(attempt=attempt, rank=rank, t=t, msg=log_step(s, t)) for s in steps]
        return out

    def cause_lines(self, last_step_t: float | None) -> list[str]:
        """The last lines a death's cause may be read from: from the last line a step was read
        from (an uninstrumented attempt), else those read since the attempt's last step (its
        reporter's); a traceback printed and handled before the last step is not the cause."""
        at = self._step_at
        if at == self._seen - 1 and self._before_at >= 0:
            # The last line is a step's: a bar drawn once more as the trainer exits (tqdm's close
            # redraw, after the traceback it died of): read from the step line before it.
            at = self._before_at
        if at >= 0 and self._seen - at <= len(self.lines):
            return self.lines[len(self.lines) - (self._seen - at) :]
        if last_step_t is not None:
            return [ln for ln, t in zip(self.lines, self.times, strict=True) if t >= last_step_t]
        return list(self.lines)

    def truncated_words(self) -> str:
        return (
            f"{self.truncated} line(s) of {self.path.name} longer than {MAX_LINE_BYTES >> 10} KiB: "
            f"each read to its first {MAX_LINE_BYTES >> 10} KiB only, the rest skipped"
        )

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
        self._buf, self._pos, self._peeked = b"", 0, False

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
            self.offset, self._rest, self._buf, self._pos = skip_to, b"", b"", 0
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
            self._rest, self._skipping, self._buf, self._pos = b"", False, b"", 0
            return rest + b"\n" + self._take()
        return data

    def read(
        self, final: bool = False, *, recognise: bool = True, budget_s: float = READ_BUDGET_S
    ) -> list[LogStep]:
        """The steps in what was appended since the last read. `final`: the attempt ended, so
        the file is read to its end, an unfinished last line is whole and what a recogniser held
        back is given out. `recognise`: False keeps the lines (a traceback) without reading steps
        (an instrumented attempt). At most `budget_s` (FINAL_BUDGET_S when final) is spent
        recognising: the lines left are read on the next call (final: kept, not recognised)."""
        deadline = time.monotonic() + (FINAL_BUDGET_S if final else budget_s)
        self._ended, self._now = final, time.time()
        out: list[LogStep] = []
        for _ in range(4 if final else 1):  # final: to the file's end (at most 4 backlogs)
            if self._pos >= len(self._buf):
                try:
                    self._buf, self._pos = self._take(), 0
                except OSError as exc:
                    self.notices.append(f"{self.path.name} cannot be read: {exc.strerror or exc}")
                    self._close()
                    self._buf, self._pos = b"", 0
                if not self._buf:
                    break
            out += self._split(deadline, recognise)
            if final and self._pos < len(self._buf):
                out += self._split(None, False)  # past the budget: kept for the cause, not read
            if self._pos < len(self._buf):
                self.deferred += 1
                return out  # the budget is spent: the rest on the next tick, no peek at a stale line
        if final:
            if self._rest:
                out += self._line(self._rest, recognise)
            self._rest, self._skipping, self._peeked = b"", False, False
            out += self.recognition.end()
            self.pace.restart()
            self.unread, self._unread_told = 0, False  # the next attempt is counted afresh
        elif self._rest and recognise and not self._peeked:
            self._peeked = True  # once per change: a bar's last redraw is not read again each tick
            rest = self._rest.decode("utf-8", "replace")
            out += self._timed(rest, self.recognition.peek(rest))
        self._trim(KEEP_LINES)
        return out

    def _trim(self, keep: int) -> None:
        del self.lines[:-keep]
        del self.times[:-keep]

    def _split(self, deadline: float | None, recognise: bool) -> list[LogStep]:
        """Cuts the buffer into lines from where the last call stopped, until its end or the
        deadline (checked between lines; None: none)."""
        out: list[LogStep] = []
        data = self._buf
        for m in _LINE_END.finditer(data, self._pos):
            piece = data[self._pos : m.start()]
            self._pos = m.end()
            if self._skipping:
                self._skipping = False
                continue  # the end of a line already cut and read
            out += self._line(self._rest + piece[: MAX_LINE_BYTES + 1], recognise)
            self._rest, self._peeked = b"", False
            if deadline is not None and time.monotonic() > deadline:
                return out
        tail = data[self._pos :]
        self._pos = len(data)
        if self._skipping or not tail:
            return out
        self._rest += tail[: MAX_LINE_BYTES + 1 - len(self._rest)]
        self._peeked = False
        if len(self._rest) > MAX_LINE_BYTES:
            # Past the bound with no line end: read its first MAX_LINE_BYTES now, once.
            out += self._line(self._rest, recognise)
            self._rest, self._skipping = b"", True
        return out

    def _line(self, raw: bytes, recognise: bool = True) -> list[LogStep]:
        if len(raw) > MAX_LINE_BYTES:
            self.truncated += 1
            raw = raw[:MAX_LINE_BYTES]
        if not raw.strip():
            return []  # `\r\n`, a bar's blank redraw
        line = raw.decode("utf-8", "replace")
        self.lines.append(line)
        self.times.append(self._now)
        self._seen += 1
        if len(self.lines) > 2 * KEEP_LINES:
            self._trim(KEEP_LINES)
        if not recognise:
            return []
        if self.recognition.chosen is None:
            self.unread += 1
        got = self._timed(line, self.recognition.feed(line))
        top = max((s.step for s in got), default=None)
        if top is not None and top != self._mark_step:
            # A bar's redraw of the step just read (tqdm's last one, at exit, after the
            # traceback) does not move the mark: the cause is read from the step's first line on.
            self._before_at = self._step_at
            self._step_at, self._mark_step = self._seen - 1, top
        return got

    def _timed(self, line: str, got: list[LogStep]) -> list[LogStep]:
        """The steps a line gave, with the trainer's own pace where the line says it."""
        if not got:
            return got
        return self.pace.time(ANSI.sub("", line) if "\x1b" in line else line, got, self.recognition.chosen)


class Jumps:
    """Steps read from the log that jump implausibly far (past JUMP_FACTOR times the step before,
    and past JUMP_FLOOR): one line saying `iter 999999999` is not believed until a later line goes
    on from it; a later line that goes on from the step before drops it. Either way it is said
    (`notes`), with the line's step and the one before."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.held: LogStep | None = None
        self.notes: list[str] = []

    def take(self, steps: list[LogStep]) -> list[LogStep]:
        out: list[LogStep] = []
        for s in steps:
            if self.held is not None:
                held, self.held = self.held, None
                if s.step >= held.step:
                    out.append(held)
                    self.last = held.step
                    self.notes.append(f"a later line went on from step {held.step}: it is taken")
                else:
                    self._dropped(held, f"a later line went on from step {s.step}")
            if self.last is not None and s.step > JUMP_FACTOR * max(self.last, JUMP_FLOOR):
                self.held = s
                self.notes.append(
                    f"trainer.log said step {s.step} right after step {self.last}: not believed yet (a jump "
                    f"past {JUMP_FACTOR}x the step before); taken once a later line goes on from it"
                )
                continue
            out.append(s)
            self.last = s.step
        return out

    def _dropped(self, held: LogStep, why: str) -> None:
        self.notes.append(f"trainer.log's step {held.step} (after step {self.last}) dropped: {why}")

    def end(self) -> None:
        """The attempt ended: a step still held is dropped; the next attempt starts afresh."""
        if self.held is not None:
            self._dropped(self.held, "no later line went on from it before the attempt ended")
        self.held, self.last = None, None


def log_step(s: LogStep, t: float) -> p.Step:
    return p.Step(
        step=s.step,
        t=t,
        loss=s.loss,
        grad_norm=s.grad_norm,
        lr=[s.lr] if s.lr is not None else [],
        source="log",
        rate=s.rate,
        rate_from=s.rate_from,
    )
