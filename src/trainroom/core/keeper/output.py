"""Where an attempt's stdout and stderr go: a pipe drained by the output pump (keeper.outpump)
into trainer.log, so that no write error there (a full state disk) can reach the trainer.

The keeper keeps a spare read end of each attempt's pipe: a pump that dies while the trainer
still writes is replaced on the same pipe, and only the pump and the keeper both gone could
leave the pipe without a reader. What the pump drops is told back (`lost`, `resumed`) and kept
here as an OutputLoss, which the state-disk rule reads. When no pump can start, the trainer
writes to trainer.log directly, as it would without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
import termios
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import BinaryIO

from trainroom.core.health.statedisk import OutputLoss
from trainroom.core.keeper.outpump import open_log, widen

DRAIN_WAIT_S = 2.0  # the longest an ended attempt waits for its last output to reach the file
DRAIN_STEP_S = 0.02
QUIET_S = 0.25


def _unread(fd: int) -> int | None:
    """Bytes waiting in the pipe (FIONREAD); None where it cannot be asked."""
    try:
        got = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return None
    return int.from_bytes(got, sys.byteorder)


class _Pipe:
    """One attempt's pipe: the spare read end and the pump draining it."""

    def __init__(self, n: int, spare: int) -> None:
        self.n = n
        self.spare = spare
        self.pump: asyncio.subprocess.Process | None = None
        self.done = asyncio.Event()  # the pump reached the end of the pipe and wrote all
        self.lost_before = 0  # what pumps of this pipe that died had lost
        self.lost = 0  # what the live pump has lost (its own total)


class TrainerOutput:
    """The pipes of the attempts, their pumps and what they lost."""

    def __init__(self, log_path: Path, on_note: Callable[[str, str], None]) -> None:
        self.log_path = log_path
        self._note = on_note
        self.loss = OutputLoss(path=str(log_path))
        self._pipes: dict[int, _Pipe] = {}
        self._lost_closed = 0  # what the pipes already closed lost
        # Attempts whose process ended and whose last output is still on its way to the file: the
        # keeper judges them once it is there (their traceback is the cause of their death).
        self.ending: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def log_file(self) -> BinaryIO:
        """trainer.log for the keeper's own lines, opened the pump's way (never blocking on a FIFO,
        never through a symlink); /dev/null when it is refused or cannot be opened."""
        fd, _why = open_log(str(self.log_path))
        return os.fdopen(fd, "ab", buffering=0) if fd is not None else open(os.devnull, "ab", buffering=0)

    async def open(self, n: int) -> int | None:
        """The write end for attempt `n`'s stdout and stderr (the caller closes it once the
        trainer has it), or None: no pump could start, the trainer writes to the file."""
        try:
            r, w = os.pipe()
        except OSError as exc:
            self._note(
                f"no pipe for the trainer's output ({exc}): the trainer writes to {self.log_path}", "warning"
            )
            return None
        widen(w)
        pipe = _Pipe(n, r)
        if not await self._start_pump(pipe):
            os.close(r)
            os.close(w)
            return None
        self._pipes[n] = pipe
        return w

    async def _start_pump(self, pipe: _Pipe) -> bool:
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "trainroom.core.keeper.outpump",
                str(self.log_path),
                stdin=pipe.spare,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,
                close_fds=True,
            )
        except OSError as exc:
            self._note(
                f"trainer output pump could not start ({exc}): the trainer writes to {self.log_path}",
                "warning",
            )
            return False
        pipe.pump = proc
        self._spawn(self._watch(pipe, proc))
        return True

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, pipe: _Pipe, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            self._told(pipe, line.decode(errors="replace").split())
        rc = await proc.wait()
        pipe.lost_before, pipe.lost = pipe.lost_before + pipe.lost, 0
        if rc == 0:
            self._close(pipe)
            return
        # Killed or crashed with the trainer maybe still writing: another pump on the same pipe.
        self._note(f"trainer output pump of attempt {pipe.n} ended ({rc}); another one takes over", "warning")
        if pipe.n in self._pipes and not await self._start_pump(pipe):
            self._close(pipe)

    def _total(self) -> int:
        return self._lost_closed + sum(p.lost_before + p.lost for p in self._pipes.values())

    def _told(self, pipe: _Pipe, words: list[str]) -> None:
        if words == ["eof"]:
            pipe.done.set()
            return
        if words[:1] in (["refused"], ["accepted"]) and len(words) > 1 and words[1].isdigit():
            self._refusal(words[0], int(words[1]), " ".join(words[2:]))
            return
        try:
            total, since = int(words[1]), float(words[2])
        except (IndexError, ValueError):
            return
        pipe.lost = total
        path = str(self.log_path)
        if words[0] == "lost":
            self.loss = OutputLoss(lost_bytes=self._total(), since=since, losing=True, path=path)
        elif words[0] == "resumed" and len(words) > 3:
            self.loss = OutputLoss(lost_bytes=self._total(), since=since, resumed=float(words[3]), path=path)
            lost_at = time.strftime("%H:%M:%S", time.localtime(since))
            self._note(
                f"trainer output reaches {self.log_path.name} again: {self.loss.lost_bytes} bytes of it were "
                f"lost since {lost_at} (the state dir's disk was full; the trainer went on)",
                "warning",
            )

    def _refusal(self, what: str, dropped: int, why: str) -> None:
        """trainer.log is not a regular file (a FIFO, a symlink, a device): the pump does not write
        into it, drains the trainer's output and drops it; or it is a regular file again."""
        if what == "refused":
            self._note(
                f"trainer output is not written to {self.log_path.name}: {why}; it is drained and dropped "
                f"({dropped} bytes so far) so the trainer never blocks, until {self.log_path.name} is a "
                "regular file again (remove what is there)",
                "warning",
            )
        else:
            self._note(
                f"trainer output reaches {self.log_path.name} again: {dropped} bytes were dropped while it "
                "was not a regular file",
                "info",
            )

    def _close(self, pipe: _Pipe) -> None:
        if self._pipes.get(pipe.n) is pipe:
            del self._pipes[pipe.n]
            self._lost_closed += pipe.lost_before + pipe.lost
            if self.loss.losing and not any(self._pipes):
                # Nothing writes any more: what was lost stays counted, nothing is being lost.
                self.loss = OutputLoss(lost_bytes=self._total(), since=self.loss.since, path=self.loss.path)
        with contextlib.suppress(OSError):
            os.close(pipe.spare)
        pipe.done.set()

    async def drained(self, n: int, timeout: float = DRAIN_WAIT_S) -> None:
        """Wait (at most `timeout`) until attempt `n`'s output is in the file: its pump wrote all
        the pipe carried up to its end. A child the trainer left holding its stdout keeps that end
        away: then it is enough that the pipe held nothing unread for QUIET_S (the pump had the
        time to write what it read)."""
        pipe = self._pipes.get(n)
        if pipe is None:
            return
        self.ending.add(n)
        try:
            await self._drain(pipe, timeout)
        finally:
            self.ending.discard(n)

    async def _drain(self, pipe: _Pipe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while not pipe.done.is_set() and time.monotonic() < deadline:
            if _unread(pipe.spare) == 0:
                quiet_since = quiet_since if quiet_since is not None else time.monotonic()
                if time.monotonic() - quiet_since >= QUIET_S:
                    return
            else:
                quiet_since = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pipe.done.wait(), DRAIN_STEP_S)

    def close(self) -> None:
        """The keeper exits: the pumps go on draining whatever still writes, on their own."""
        for pipe in list(self._pipes.values()):
            with contextlib.suppress(OSError):
                os.close(pipe.spare)
        self._pipes.clear()


def log_line(log: BinaryIO, text: str) -> None:
    """A keeper line in trainer.log; a full disk must not stop an attempt from starting."""
    try:
        log.write(f"=== trainroom: {text} ===\n".encode())
    except OSError:
        pass
