"""Adoption: the keeper supervising a trainer it did not start (`trainroom attach`).

The keeper is not the adopted process's parent, so it cannot wait for it: it holds a pidfd
(`pidfd_open`), which becomes readable the moment the process exits, and the event loop watches
that descriptor (no polling loop). The exit status is the parent's alone: an adopted attempt's
end says "exit status unknown (attached, not its parent)" and takes its cause from what the
trainer wrote last (the log tail, read as for any attempt) and the kernel log (an OOM kill names
the pid there) where it is readable. Everything else (the log tail, the probes, the workers under
a torchrun agent, checkpoints by watched globs) is the keeper's usual supervision.

A takeover (a resume once the adopted process has ended) starts a normal attempt from the argv,
cwd and environment recorded at attach time (`base_env`): from then on the keeper is its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Callable
from typing import Protocol

from trainroom.core.probes.adopt import Adoptee
from trainroom.core.probes.procs import same_start, wait_exit
from trainroom.core.run.store import RunRecord
from trainroom.core.sdk.lr import requested_from_argv
from trainroom.core.wire import protocol as p

UNKNOWN = "exit status unknown (attached, not its parent)"
KMSG = "/dev/kmsg"
KMSG_RECORDS = 50_000  # the most kernel log records read for one death


class Adopted:
    """The adopted trainer as the keeper holds it in place of a child: a pid, and no return code
    ever (the keeper drops it once the pidfd says the process has ended)."""

    returncode: int | None = None

    def __init__(self, pid: int) -> None:
        self.pid = pid


class AdoptHost(Protocol):
    """What adoption asks of the keeper: its record, its attempt counter and child slot, a way to
    record, and the same ending an attempt it started gets."""

    record: RunRecord
    attempt_n: int

    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...

    def note(self, message: str, kind: str = "info") -> None: ...

    def trainer_alive(self) -> bool: ...

    def adopt_child(self, handle: Adopted) -> None: ...

    async def attempt_over(
        self, n: int, proc: object, ended_of: Callable[[float], p.AttemptEnded]
    ) -> None: ...


def begin(host: AdoptHost, a: Adoptee) -> asyncio.Task[None]:
    """Attempt 1 is the adopted process: journaled as such, its end watched through a pidfd."""
    host.attempt_n = 1
    handle = Adopted(a.pid)
    host.adopt_child(handle)
    host.emit(adopted_started(a, 1))
    where = f"the log {a.log} ({a.log_why})" if a.log else f"no log: pass --log ({a.log_why})"
    host.note(f"attached to pid {a.pid} ({' '.join(a.argv)[:120]}); {where}", "info" if a.log else "warning")
    return asyncio.get_running_loop().create_task(watch(host, 1, handle, a))


def detach(host: AdoptHost) -> None:
    """The keeper of an attached run is ending while its trainer lives: said, and nothing done to it."""
    a = host.record.attached
    if a is not None and host.trainer_alive():
        host.note(f"detached: the keeper exits and leaves pid {a.pid} running, untouched", "warning")


def base_env(record: RunRecord) -> dict[str, str]:
    """An attempt's environment before the keeper's own variables: an attached run's recorded
    environment (a takeover relaunches the command as it was started), else the keeper's."""
    return dict(record.attached.env) if record.attached is not None else dict(os.environ)


def adopted_started(a: Adoptee, n: int) -> p.AttemptStarted:
    return p.AttemptStarted(
        n=n,
        t=time.time(),
        pid=a.pid,
        # Its own group when it leads one (setsid, a shell's job); else no group of its own: a
        # kill then takes it and its descendants, never the script that started it.
        pgid=a.pid,
        start_time=a.start_time,
        start_ticks=a.start_ticks,
        argv=list(a.argv),
        cwd=a.cwd,
        requested=requested_from_argv(a.argv),
        attached=True,
    )


async def gone(a: Adoptee) -> None:
    """Returns when the adopted process has exited: a pidfd readable on the event loop, opened
    only while the pid still names the process attach read (pid + start tick)."""
    try:
        fd = os.pidfd_open(a.pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd here (an old kernel, a seccomp filter): a thread waits instead
        await asyncio.to_thread(wait_exit, a.pid, None, start_time=a.start_time, ticks=a.start_ticks)
        return
    try:
        if not same_start(a.pid, a.start_time, a.start_ticks):
            return  # it ended before the pidfd was opened, and the pid is someone else's now
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def readable() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await ended
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


def kernel_cause(pid: int, path: str = KMSG) -> str:
    """What the kernel log says of `pid`'s end (an OOM kill), or that it says nothing, or why it
    could not be read; one clause, read without blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"the kernel log is not readable here ({path}: {exc.strerror}), so an OOM kill cannot be ruled out"
    found: str | None = None
    needles = (f"Killed process {pid} ".encode(), f",pid={pid},".encode())
    try:
        for _ in range(KMSG_RECORDS):
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten while reading: go on with the next
                break  # EAGAIN: the end of the log
            if not rec:
                break
            if any(n in rec for n in needles):
                found = rec.split(b";", 1)[-1].strip().decode(errors="replace")[:200]
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if found is None:
        return "the kernel log names no OOM kill of it"
    return f"the OOM killer ended it (kernel log: {found})"


async def watch(host: AdoptHost, n: int, handle: Adopted, a: Adoptee) -> None:
    """Wait for the adopted process's end, then end its attempt as the keeper ends any other."""
    await gone(a)
    cause = await asyncio.to_thread(kernel_cause, a.pid)

    def ended_of(now: float) -> p.AttemptEnded:
        return p.AttemptEnded(n=n, t=now, error=f"{UNKNOWN}; {cause}")

    await host.attempt_over(n, handle, ended_of)
