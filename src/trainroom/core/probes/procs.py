"""Processes: the kernel's state letter for each member of a process group, duplicates of the
trainer (or of a configured host process), and a pidfd-based wait for a process to exit.

The state comes straight from `/proc/<pid>/stat` because psutil has no process-group view and the
letter is what the watchdog needs: Z (zombie), T/t (stopped, traced), D (uninterruptible I/O).
`proc_root` is injectable so tests can point at a prepared tree; it defaults to the real /proc.
"""

from __future__ import annotations

import os
import re
import select
import time
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

import psutil

from trainroom.core.samples import Duplicate

PROC = "/proc"

# The letters that mean "not making progress on its own" (see proc(5)).
STOPPED = frozenset("Tt")
ZOMBIE = frozenset("ZX")
DISK_SLEEP = frozenset("D")

STATE_NAMES = {
    "R": "running",
    "S": "sleeping",
    "D": "disk-sleep",
    "T": "stopped",
    "t": "tracing-stop",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "paging",
    "K": "wakekill",
}


class ProcStat(NamedTuple):
    pid: int
    comm: str
    state: str  # the kernel's letter
    ppid: int
    pgid: int
    sid: int
    start_ticks: int  # field 22: start time in clock ticks since boot (tells a reused pid apart)
    # field 52 (Linux >= 3.5): the wait status a zombie left for its parent; 0 while it runs, and
    # 0 where the kernel hides it from us (another user's process).
    wait_status: int | None = None
    utime: int = 0  # fields 14 and 15: CPU time in user and kernel mode, in clock ticks
    stime: int = 0
    rss_pages: int = 0  # field 24: resident set size, in pages
    # field 50: where its environment lies in its memory. A forked child shares its parent's until
    # it execs (then /proc/<pid>/environ is still the parent's); an exec moves it.
    env_start: int = 0


def read_stat(pid: int, proc_root: str = PROC) -> ProcStat | None:
    """One process's /proc/<pid>/stat, or None when it does not exist (any more)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
        return None
    # comm may hold spaces and parentheses: it ends at the LAST ')'.
    lpar, rpar = raw.find("("), raw.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    fields = raw[rpar + 2 :].split()
    try:
        return ProcStat(
            pid=int(raw[:lpar]),
            comm=raw[lpar + 1 : rpar],
            state=fields[0],
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            start_ticks=int(fields[19]),
            wait_status=int(fields[49]) if len(fields) > 49 else None,
            utime=int(fields[11]),
            stime=int(fields[12]),
            rss_pages=int(fields[21]),
            env_start=int(fields[47]) if len(fields) > 47 else 0,
        )
    except (IndexError, ValueError):
        return None


# psutil's create time is a boot time read from /proc/stat (which moves with wall-clock steps)
# plus the clock ticks: two readers of one process agree only to about a second.
START_TIME_TOLERANCE_S = 1.0


def uptime_s(proc_root: str = PROC) -> float | None:
    """Seconds since boot (start_ticks' clock, in seconds), or None when it cannot be read."""
    try:
        with open(f"{proc_root}/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start_ticks(pid: int, proc_root: str = PROC) -> int | None:
    """The process's start in clock ticks since boot (exact, immune to clock steps), or None."""
    st = read_stat(pid, proc_root)
    return None if st is None else st.start_ticks


def same_start(pid: int, start_time: float, ticks: int | None = None, proc_root: str = PROC) -> bool | None:
    """Whether `pid` still names the process that started then; None when no process has it.

    By the clock tick where it was recorded (a pid reused even a moment later differs); else
    psutil's create time within START_TIME_TOLERANCE_S.
    """
    if ticks is not None:
        now = start_ticks(pid, proc_root)
        if now is not None:
            return now == ticks
    try:
        return abs(psutil.Process(pid).create_time() - start_time) <= START_TIME_TOLERANCE_S
    except (psutil.NoSuchProcess, ValueError):
        return None


def started_since(t: float, ticks: int | None, ref_t: float, ref_ticks: int | None) -> bool:
    """Whether a process that started at (t, ticks) started no earlier than the reference one
    (a member of an attempt's group cannot be older than the attempt)."""
    if ticks is not None and ref_ticks is not None:
        return ticks >= ref_ticks
    return t >= ref_t - START_TIME_TOLERANCE_S


def process_state(pid: int, proc_root: str = PROC) -> str | None:
    """The state letter of one pid; None when the pid does not exist."""
    st = read_stat(pid, proc_root)
    return st.state if st is not None else None


def state_name(letter: str | None) -> str:
    return "gone" if letter is None else STATE_NAMES.get(letter, letter)


def _pids(proc_root: str) -> Iterable[int]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return (int(n) for n in names if n.isdigit())


def scan(proc_root: str = PROC) -> list[ProcStat]:
    """Every process's /proc/<pid>/stat, read once: one walk serves a probe cycle's group
    members and the process tree (probes.workers) alike."""
    out = []
    for pid in _pids(proc_root):
        st = read_stat(pid, proc_root)
        if st is not None:
            out.append(st)
    return out


def group_members(
    pgid: int, proc_root: str = PROC, table: Iterable[ProcStat] | None = None
) -> list[ProcStat]:
    """Every process whose process group is `pgid` (the attempt's group: trainer, ranks, workers);
    from `table` (a `scan`) when given, else from a fresh walk."""
    if pgid <= 0:
        return []
    found = table if table is not None else scan(proc_root)
    return sorted((st for st in found if st.pgid == pgid), key=lambda s: s.pid)


def group_states(pgid: int, proc_root: str = PROC, table: Iterable[ProcStat] | None = None) -> dict[int, str]:
    """pid -> state letter for the members of a process group: what WatchContext.proc_states takes."""
    return {st.pid: st.state for st in group_members(pgid, proc_root, table)}


def thread_activity(pid: int, tid: int | None = None, proc_root: str = PROC) -> int | None:
    """A counter that moves whenever a thread runs: CPU ticks plus context switches of one thread
    (the main thread by default: its tid is the pid). None when it cannot be read.

    What tells a parked main thread (blocked on a lock: the counter stands still) from a busy
    one that keeps returning to the same line (a loop that never steps: the counter moves), which
    the reporter's main_frame_age alone cannot.
    """
    tid = pid if tid is None else tid
    base = f"{proc_root}/{pid}/task/{tid}"
    try:
        with open(f"{base}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
        with open(f"{base}/status") as f:
            status = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        total = int(fields[11]) + int(fields[12])  # utime + stime
    except (IndexError, ValueError):
        return None
    for line in status.splitlines():
        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
            try:
                total += int(line.split(":", 1)[1])
            except ValueError:
                pass
    return total


def group_activity(pids: Iterable[int], proc_root: str = PROC) -> dict[int, int]:
    """pid -> main-thread activity counter for each pid that can be read."""
    out = {}
    for pid in pids:
        v = thread_activity(pid, proc_root=proc_root)
        if v is not None:
            out[pid] = v
    return out


# --------------------------------------------------------------------------- duplicates

_VERSION_TAIL = re.compile(r"[\d.]+$")


def _program(argv0: str) -> str:
    """python3.11, /usr/bin/python3 and python all name one program for duplicate matching."""
    return _VERSION_TAIL.sub("", os.path.basename(argv0)) or os.path.basename(argv0)


def same_command(a: Sequence[str], b: Sequence[str]) -> bool:
    if not a or not b or len(a) != len(b):
        return False
    return list(a[1:]) == list(b[1:]) and _program(a[0]) == _program(b[0])


def _descendants(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _same_slurm_step(proc: psutil.Process) -> bool:
    """`proc` is a task of the Slurm job step this keeper runs in (its rank siblings share the
    command and the directory by design)."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not job or not step:
        return False
    env = proc.environ()
    return env.get("SLURM_JOB_ID") == job and env.get("SLURM_STEP_ID") == step


def trainer_duplicates(
    argv: Sequence[str],
    cwd: str,
    *,
    trainer_pid: int | None = None,
    own_pgid: int | None = None,
    exclude: Collection[int] = (),
    run_id: str = "",
) -> Duplicate | None:
    """Another process that runs the trainer's command in the trainer's working directory.
    `trainroom replay` of this run (`TRAINROOM_REPLAY_OF` = `run_id`, isolated) is none.

    The trainer's own process group and its descendants (data-loader workers, torchrun ranks carry
    the same command line) are ours, not duplicates. The live trainer's /proc cmdline wins over
    the recorded argv (it is what a duplicate started by hand would also show).
    """
    cmdline: list[str] = list(argv)
    ours: int | None = None
    if trainer_pid:
        try:
            proc = psutil.Process(trainer_pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                cmdline = proc.cmdline() or cmdline
                ours = trainer_pid
        except psutil.Error:
            pass
    if not cmdline:
        return None
    mine = set(exclude) | {os.getpid()}
    if ours is not None:
        mine |= {ours} | _descendants(ours)
    real_cwd = os.path.realpath(cwd)
    others: list[int] = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid in mine or not same_command(proc.info["cmdline"] or [], cmdline):
                continue
            if own_pgid and os.getpgid(proc.pid) == own_pgid:
                continue
            if os.path.realpath(proc.cwd()) != real_cwd or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if _same_slurm_step(proc):
                continue  # another task of this Slurm step (`srun -n N python train.py`): a rank
            if run_id and proc.environ().get("TRAINROOM_REPLAY_OF") == run_id:
                continue  # `trainroom replay` of this run, beside it in a namespace of its own
        except (psutil.Error, OSError):
            continue
        others.append(proc.pid)
    if not others:
        return None
    others.sort()
    return Duplicate(
        kind="trainer",
        ours=ours,
        others=others,
        pids=([ours] if ours is not None else []) + others,
        cmdline=cmdline,
        cwd=real_cwd,
    )


def host_process_duplicates(names: Iterable[str]) -> list[Duplicate]:
    """Two or more instances of a configured host process (e.g. the VM's): a session that was not
    released. Matched on the process name or the basename of argv[0]."""
    wanted = {n for n in names if n}
    if not wanted:
        return []
    found: dict[str, list[int]] = {}
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = proc.info["cmdline"] or []
            candidates = {proc.info["name"] or ""} | ({os.path.basename(cmd[0])} if cmd else set())
        except psutil.Error:
            continue
        for name in wanted & candidates:
            found.setdefault(name, []).append(proc.pid)
    return [
        Duplicate(kind="host", name=name, pids=sorted(pids), others=sorted(pids)[1:])
        for name, pids in sorted(found.items())
        if len(pids) >= 2
    ]


# --------------------------------------------------------------------------- waiting for an exit


def wait_exit(
    pid: int, timeout: float | None = None, *, start_time: float | None = None, ticks: int | None = None
) -> bool:
    """True once `pid` has exited (a zombie counts: it will never run again), False on timeout.

    A pidfd wakes within a millisecond of the exit and cannot be fooled by a reused pid once
    opened; where pidfd_open is missing (Linux < 5.3, other systems) psutil is polled instead.
    `start_time` (psutil's create_time) and `ticks` guard against a pid reused before we got to look.
    """
    if start_time is not None:
        try:
            if not same_start(pid, start_time, ticks):
                return True  # no such process, or that pid is someone else now: ours is gone
        except psutil.Error:
            pass
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return True
        except OSError:
            fd = None  # e.g. ENOSYS under an old kernel or a seccomp filter
        if fd is not None:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
            finally:
                os.close(fd)
    return _wait_exit_polling(pid, timeout)


def _wait_exit_polling(pid: int, timeout: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            # psutil.pid_exists says "alive" for a zombie: the status is what tells.
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:
            pass
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
