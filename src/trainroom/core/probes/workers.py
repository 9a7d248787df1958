"""The attempt's rank processes, found through the process tree whatever their session.

torch elastic (torchrun) starts each worker with `start_new_session=True`: a worker is in neither
the attempt's process group nor its session, only under its leader in the tree. So a probe cycle
walks /proc once (`procs.scan`, which the group view needs anyway), follows ppid links down from
the attempt's leader, and takes as a worker each process whose environment names its rank and
whose parent is not a worker of that same rank (a DataLoader worker inherits its rank's
environment: it is part of that rank, not a rank of its own).

A rank is what the environment says, never a default: RANK (torchrun sets it), else node rank x
ranks per node + LOCAL_RANK (GROUP_RANK and LOCAL_WORLD_SIZE, or Lightning's NODE_RANK). Lightning
launches its own ranks: the process the user started is local rank 0 and it re-runs the script
for each other local rank with LOCAL_RANK, NODE_RANK and WORLD_SIZE and no RANK; the environment
it was itself started with says nothing (it sets its own variables after starting). So a process
whose children carry LOCAL_RANK > 0 without RANK, and who carries none itself, is that node's
local rank 0, and the ranks per node are it and those children.

Cost: the walk is the one the group view already made; an environment is read once per new
process (cached by pid and start tick), so a steady cycle reads nothing more than stat files. One
exception: a young process that still shares its parent's environment address may not have
exec'd yet (/proc/<pid>/environ is then its parent's: torchrun's, with no RANK): it is read again
each cycle until it has exec'd or is EXEC_WINDOW_S old (a DataLoader worker, which never execs,
costs a read a cycle for that long), so a worker caught between fork and exec is never taken for
a process without a rank for the rest of its life.
A zombie's wait status (stat field 52) says how a worker ended, if read before torchrun reaps it:
`exit_handle` gives a pidfd that becomes readable the moment the worker exits, for a reader that
wakes within a millisecond, well inside torchrun's 0.1 s monitor interval.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from trainroom.core.probes.procs import PROC, ProcStat, read_stat, uptime_s
from trainroom.core.probes.runof import RunOf, run_of
from trainroom.core.samples import GONE_STATES, Worker

# What a process's starting environment says of its rank: `runof.RunOf` with a rank.
RankEnv = RunOf
# How long after its start a process that shares its parent's environment may still be between
# fork and exec (a loaded machine can hold a vforked child that long before it runs).
EXEC_WINDOW_S = 10.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def rank_env(pid: int, proc_root: str = PROC) -> RankEnv | None:
    """The run, rank, LOCAL_RANK, WORLD_SIZE and torch elastic's restart budget `pid` was started
    with (`runof.run_of`), or None when it carries no rank of its own or cannot be read."""
    found = run_of(pid, proc_root)
    rank = found.global_rank() if found is not None else None
    if found is None or rank is None or rank < 0:
        return None
    return found._replace(rank=rank)


def descendants(table: Iterable[ProcStat], roots: Iterable[int]) -> list[ProcStat]:
    """Every process below `roots` in the tree (by ppid), parents before children."""
    children: dict[int, list[ProcStat]] = {}
    for st in table:
        children.setdefault(st.ppid, []).append(st)
    out: list[ProcStat] = []
    seen = set(roots)
    todo = list(seen)
    while todo:
        for st in children.get(todo.pop(), ()):
            if st.pid not in seen:
                seen.add(st.pid)
                out.append(st)
                todo.append(st.pid)
    return out


def _carries_rank(env: RunOf | None) -> bool:
    return env is not None and (env.rank is not None or env.local_rank is not None)


def _relaunched(env: RunOf | None) -> bool:
    """Started by a launcher that sets LOCAL_RANK but no RANK (Lightning), as a rank other than
    its node's first."""
    return env is not None and env.rank is None and env.local_rank is not None and env.local_rank > 0


def node_launchers(procs: Sequence[ProcStat], envs: dict[int, RunOf | None]) -> dict[int, tuple[RunOf, int]]:
    """pid -> (its environment as local rank 0, ranks on its node) for each process that launched
    ranks itself (Lightning): it carries no rank, and children of its carry LOCAL_RANK > 0."""
    kids: dict[int, list[RunOf]] = {}
    for st in procs:
        env = envs.get(st.pid)
        if env is not None and _relaunched(env) and not _carries_rank(envs.get(st.ppid)):
            kids.setdefault(st.ppid, []).append(env)
    out: dict[int, tuple[RunOf, int]] = {}
    for pid, found in kids.items():
        if pid not in envs:
            continue  # its parent is outside the attempt's tree
        per_node = max(e.local_rank or 0 for e in found) + 1
        first = found[0]
        own = RunOf(
            run=first.run,
            attempt=first.attempt,
            rank=None,
            local_rank=0,
            world_size=first.world_size,
            node_rank=first.node_rank,
            local_world_size=first.local_world_size or per_node,
        )
        out[pid] = (own, per_node)
    return out


class WorkerFinder:
    """Finds the attempt's workers each probe cycle; keeps each process's environment so a
    steady run costs no environ read (keyed by pid and start tick: a reused pid is read anew)."""

    def __init__(self, proc_root: str = PROC) -> None:
        self.proc_root = proc_root
        self._env: dict[tuple[int, int], RunOf | None] = {}

    def find(self, table: Sequence[ProcStat], leader: int) -> list[Worker]:
        """The workers at and under `leader` (the attempt's pid), by rank then pid. The leader is
        one only where it launched ranks itself (Lightning's rank 0)."""
        if leader <= 0:
            return []
        head = [st for st in table if st.pid == leader]
        procs = head + descendants(table, [leader])
        live = {(st.pid, st.start_ticks) for st in procs}
        self._env = {k: v for k, v in self._env.items() if k in live}
        envs: dict[int, RunOf | None] = {}
        env_start = {st.pid: st.env_start for st in procs}
        now: float | None = None  # seconds since boot, read once a cycle when a young fork asks
        for st in procs:
            key = (st.pid, st.start_ticks)
            if key in self._env:
                envs[st.pid] = self._env[key]
                continue
            env = envs[st.pid] = run_of(st.pid, self.proc_root)
            if env_start.get(st.ppid) == st.env_start:
                now = uptime_s(self.proc_root) if now is None else now
                if now is not None and now - st.start_ticks / _CLK_TCK < EXEC_WINDOW_S:
                    continue  # maybe not exec'd yet: its parent's environment; read it again
            self._env[key] = env
        launchers = node_launchers(procs, envs)
        rank_of: dict[int, int] = {}  # pid -> rank, for the ones found to be workers
        out: list[Worker] = []
        for st in procs:  # parents first: a child sees whether its parent is a worker
            env = envs[st.pid]
            per_node: int | None = None
            if st.pid in launchers:
                env, per_node = launchers[st.pid]
            elif _relaunched(env) and st.ppid in launchers:
                per_node = launchers[st.ppid][1]
            rank = env.global_rank(per_node) if env is not None else None
            if env is None or rank is None or rank < 0:
                continue
            if st.pid == leader and st.pid not in launchers:
                continue  # the leader itself is a rank only as Lightning's launcher
            if rank_of.get(st.ppid) == rank:
                rank_of[st.pid] = rank  # a DataLoader worker of that rank: its rank's, not one
                continue
            rank_of[st.pid] = rank
            out.append(
                Worker(
                    pid=st.pid,
                    rank=rank,
                    state=st.state,
                    start_ticks=st.start_ticks,
                    local_rank=env.local_rank,
                    world_size=env.world_size,
                    ppid=st.ppid,
                    pgid=st.pgid,
                    sid=st.sid,
                    restarts_left=env.restarts_left,
                    wait_status=st.wait_status if st.state in GONE_STATES else None,
                )
            )
        return sorted(out, key=lambda w: (w.rank, w.pid))


# --------------------------------------------------------------------------- how a worker ended


class ExitStatus(NamedTuple):
    """How a process ended, decoded from its wait status: an exit code or a signal."""

    code: int | None
    signal: int | None


def decode_wait_status(status: int) -> ExitStatus:
    """waitpid(2)'s status word as (exit code, None) or (None, signal)."""
    if os.WIFSIGNALED(status):
        return ExitStatus(None, os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return ExitStatus(os.WEXITSTATUS(status), None)
    return ExitStatus(None, None)


def zombie_exit(pid: int, start_ticks: int, proc_root: str = PROC) -> ExitStatus | None:
    """How `pid` ended, while it is still an unreaped zombie of that start tick; None once it is
    reaped (or reused), while it runs, or when the kernel hides the status (another uid)."""
    st = read_stat(pid, proc_root)
    if st is None or st.start_ticks != start_ticks or st.state not in GONE_STATES:
        return None
    if not st.wait_status:
        # 0 is also a clean exit; but the kernel shows 0 where it hides the field: say so only
        # when the state says the process really is a zombie we may read (our own uid).
        return ExitStatus(0, None) if _readable(pid, proc_root) else None
    return decode_wait_status(st.wait_status)


def _readable(pid: int, proc_root: str) -> bool:
    try:
        return os.stat(f"{proc_root}/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def exit_handle(pid: int, start_ticks: int, proc_root: str = PROC) -> int | None:
    """A pidfd on `pid` (readable once it exits), if it is still the process of that start tick;
    None without pidfd_open (Linux < 5.3) or when the process is gone already. The caller closes it."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    st = read_stat(pid, proc_root)
    if st is None or st.start_ticks != start_ticks:
        os.close(fd)  # the pid names another process by now: not our worker's handle
        return None
    return fd


# --------------------------------------------------------------------------- whose line is this

# torch.distributed's excepthook writes an uncaught exception's lines as "[rank1]: Traceback ...",
# and c10d's own warnings as "[rank1]:[W1204 ...] ...".
_RANK_PREFIX = re.compile(r"^\[rank(?P<rank>\d{1,9}+)\]:")


def prefixed_rank(lines: Iterable[str]) -> int | None:
    """The rank a `[rankN]:` prefix names on the last of `lines` that carries one (a traceback
    torch.distributed's excepthook wrote), or None when none does."""
    found: int | None = None
    for line in lines:
        m = _RANK_PREFIX.match(line)
        if m is not None:
            found = int(m["rank"])
    return found


# --------------------------------------------------------------------------- torchrun's own account

# torchrun's summary when a worker fails (torch/distributed/elastic/multiprocessing/errors):
#   rank      : 1 (local_rank: 1)
#   exitcode  : -9 (pid: 767)  (SIGKILL)
# under "Failures:" (the others it then stopped) and "Root Cause (first observed failure):", and
# the agent's line as it happens: "failed (exitcode: -9) local_rank: 1 (pid: 767) of binary: ...".
_RANK_LINE = re.compile(r"^\s*+rank\s*+:\s*+(?P<rank>\d{1,9}+)\s*+\(local_rank:\s*+(?P<local>\d{1,9}+)\)")
_EXIT_LINE = re.compile(r"^\s*+exitcode\s*+:\s*+(?P<code>-?\d{1,9}+)\s*+\(pid:\s*+(?P<pid>\d{1,9}+)\)")
_AGENT_LINE = re.compile(
    r"failed \(exitcode: (?P<code>-?\d{1,9}+)\) local_rank: (?P<local>\d{1,9}+) \(pid: (?P<pid>\d{1,9}+)\)"
)
_ROOT = "Root Cause (first observed failure):"


class LauncherReport(NamedTuple):
    """One worker's end as torchrun reported it: exit code (negative: killed by that signal)."""

    pid: int
    exitcode: int
    local_rank: int
    rank: int | None  # None: from the agent's one-line report, which names the local rank only
    root_cause: bool

    @property
    def status(self) -> ExitStatus:
        return ExitStatus(None, -self.exitcode) if self.exitcode < 0 else ExitStatus(self.exitcode, None)


def launcher_reports(text: str) -> list[LauncherReport]:
    """What torchrun's failure summary (and its agent's "failed (exitcode: ...)" lines) say of
    each worker that ended, in the order written; the root cause is marked."""
    out: list[LauncherReport] = []
    root = False
    rank: tuple[int, int] | None = None
    for line in text.splitlines():
        line = line.rstrip("\r")
        if _ROOT in line:
            root = True
            continue
        if line.startswith("Failures:"):
            root = False
        m = _RANK_LINE.match(line)
        if m is not None:
            rank = (int(m["rank"]), int(m["local"]))
            continue
        m = _EXIT_LINE.match(line)
        if m is not None and rank is not None:
            out.append(LauncherReport(int(m["pid"]), int(m["code"]), rank[1], rank[0], root))
            rank = None
            continue
        m = _AGENT_LINE.search(line)
        if m is not None:
            out.append(LauncherReport(int(m["pid"]), int(m["code"]), int(m["local"]), None, False))
    return out
