"""The processes of a run: who is in an attempt's process group (or under its leader), described
(pid, cmdline, state, start, RSS, the run id in its environment), and whether each is proven the
run's. Only a process proven the run's is ever signalled, by kill, by resume's checks or by the
test teardown: started within the attempt's lifetime and carrying the run's id (the keeper
puts TRAINROOM_RUN in each attempt's environment; children inherit it)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec
import psutil

from trainroom.core.probes.procs import START_TIME_TOLERANCE_S, started_since
from trainroom.core.probes.procs import start_ticks as _ticks_of
from trainroom.core.probes.runof import run_of
from trainroom.core.units import fmt_clock


class Member(msgspec.Struct, kw_only=True):
    pid: int
    ppid: int
    pgid: int | None
    cmdline: list[str]
    state: str
    create_time: float
    start_ticks: int | None = None  # /proc/<pid>/stat field 22
    rss_bytes: int | None = None
    in_group: bool = True  # False: a descendant of the leader that left the process group
    run: str | None = None  # the TRAINROOM_RUN in its environment (None: none, or unreadable)


class Stranger(msgspec.Struct, kw_only=True, frozen=True):
    """A process found in the group (or under the leader) that is not proven the run's: never
    signalled, shown so nobody wonders why it was left."""

    pid: int
    cmdline: list[str]
    why: str


class Lifetime(msgspec.Struct, kw_only=True, frozen=True):
    """What a process must fit to be the run's: its id, and the attempt's start and end."""

    run_id: str
    start_time: float
    start_ticks: int | None = None
    ended_at: float | None = None  # None: the attempt still runs
    # An attempt `trainroom attach` adopted: its processes never carried the run's id, so the
    # proof is the leader (pid + start), its process group and its descendants, all started since.
    attached: bool = False


def not_ours(m: Member, life: Lifetime) -> str | None:
    """Why this process is not proven the run's, or None when it is."""
    if not started_since(m.create_time, m.start_ticks, life.start_time, life.start_ticks):
        return f"started at {fmt_clock(m.create_time)}, before the attempt"
    if life.ended_at is not None and m.create_time > life.ended_at + START_TIME_TOLERANCE_S:
        return f"started at {fmt_clock(m.create_time)}, after the attempt ended ({fmt_clock(life.ended_at)})"
    if m.run != life.run_id and not life.attached:
        return "its environment does not name this run" if m.run is None else f"it belongs to run {m.run}"
    return None


def live_members(pgid: int, life: Lifetime, workers: Iterable[tuple[int, int]] = ()) -> list[int]:
    """The pids alive in an attempt's process group (zombies excluded) and among its recorded
    rank processes (`workers`: pid and start tick; torchrun's have sessions of their own), proven
    the run's: a stranger that reused the group number is not the old attempt."""
    found = group_members(pgid) if pgid > 1 else []
    found += recorded_workers(workers, {m.pid for m in found})
    return sorted(m.pid for m in found if not_ours(m, life) is None)


def recorded_workers(workers: Iterable[tuple[int, int]], seen: set[int]) -> list[Member]:
    """The recorded rank processes (pid, start tick) still alive as that same process, wherever
    they are in the tree now (an orphan's parent is init), less the pids in `seen` (which it
    extends). Not yet proven the run's: `not_ours` decides, as for any member."""
    out: list[Member] = []
    for pid, ticks in workers:
        if pid in seen or ticks <= 0 or _ticks_of(pid) != ticks:
            continue
        proc = process_of(pid)
        member = describe(proc, in_group=False) if proc is not None else None
        if member is not None:
            seen.add(pid)
            out.append(member)
    return out


def process_of(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def describe(proc: psutil.Process, *, in_group: bool) -> Member | None:
    try:
        with proc.oneshot():
            state = proc.status()
            if state == psutil.STATUS_ZOMBIE:
                return None  # holds nothing; waits only for its parent to reap it
            try:
                cmdline = proc.cmdline()
            except psutil.AccessDenied:
                cmdline = [proc.name()]
            try:
                rss: int | None = proc.memory_info().rss
            except psutil.AccessDenied:
                rss = None
            found = run_of(proc.pid)
            run = found.run if found is not None else None  # unreadable: not proven ours
            return Member(
                run=run,
                pid=proc.pid,
                ppid=proc.ppid(),
                pgid=pgid_of(proc.pid),
                cmdline=cmdline,
                state=state,
                create_time=proc.create_time(),
                start_ticks=_ticks_of(proc.pid),
                rss_bytes=rss,
                in_group=in_group,
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def group_members(pgid: int) -> list[Member]:
    """The live members of a process group, by each process's current pgid."""
    found: list[Member] = []
    for proc in psutil.process_iter():
        if pgid_of(proc.pid) != pgid:
            continue
        member = describe(proc, in_group=True)
        if member is not None:
            found.append(member)
    return found
