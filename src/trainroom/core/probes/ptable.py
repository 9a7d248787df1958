"""The live attempt's processes as a tree, as nvitop's process table shows them: the leader (the
agent: torchrun, or the trainer itself), its rank workers and every child of theirs, each with its
CPU %, RSS, state, elapsed time and command line, and what the driver says it holds on the GPU.

Read from the one /proc walk the probe cycle already made (`procs.scan`: stat carries the state,
the CPU ticks and the RSS), so a steady cycle costs only the arithmetic; a command line is read
once per process (kept by pid and start tick). CPU % is the ticks a process used since the
previous cycle over the wall time between them (100 % is one core, as top says); a process seen
for the first time has none yet (None, never a made-up 0).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence

from msgspec.structs import replace

from trainroom.core.probes.procs import PROC, ProcStat, uptime_s
from trainroom.core.probes.workers import descendants
from trainroom.core.samples import GpuSample, ProcRow, Worker

CMDLINE_BYTES = 4096


def _sysconf(name: str, default: int) -> int:
    try:
        return int(os.sysconf(name))
    except (ValueError, OSError):
        return default


CLK_TCK = _sysconf("SC_CLK_TCK", 100)
PAGE_SIZE = _sysconf("SC_PAGE_SIZE", 4096)


def read_cmdline(pid: int, proc_root: str = PROC) -> list[str]:
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            raw = f.read(CMDLINE_BYTES)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def written_bytes(pid: int, proc_root: str = PROC) -> int | None:
    """/proc/<pid>/io `write_bytes`: what the process caused to be written to storage."""
    try:
        with open(f"{proc_root}/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def tree_order(table: Iterable[ProcStat], members: set[int]) -> list[ProcStat]:
    """`members` of `table`, each parent before its children (a member whose parent is no member
    is a root), roots and siblings by pid."""
    rows = sorted((st for st in table if st.pid in members), key=lambda s: s.pid)
    kids: dict[int, list[ProcStat]] = {}
    roots = []
    for st in rows:
        if st.ppid in members and st.ppid != st.pid:
            kids.setdefault(st.ppid, []).append(st)
        else:
            roots.append(st)
    out: list[ProcStat] = []
    todo = list(reversed(roots))
    while todo:
        st = todo.pop()
        out.append(st)
        todo += reversed(kids.get(st.pid, []))
    return out


class ProcessTable:
    """Builds the table each cycle; keeps the previous cycle's CPU ticks and each process's
    command line (by pid and start tick: a reused pid is read anew)."""

    def __init__(self, proc_root: str = PROC, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self.clock = clock
        self._ticks: dict[tuple[int, int], int] = {}
        self._at: float | None = None
        self._cmd: dict[tuple[int, int], list[str]] = {}
        self._written: dict[tuple[int, int], int] = {}

    def rows(
        self, table: Sequence[ProcStat], leader: int, pgid: int, workers: Sequence[Worker]
    ) -> list[ProcRow]:
        """The leader, everything under it in the tree and every other member of its process
        group (an orphan whose parent died), parents before children."""
        if leader <= 0:
            return []
        members = {leader} | {st.pid for st in descendants(table, [leader])}
        if pgid > 0:
            members |= {st.pid for st in table if st.pgid == pgid}
        ordered = tree_order(table, members)
        now = self.clock()
        dt = now - self._at if self._at is not None else None
        up = uptime_s(self.proc_root)
        worker_rank = {w.pid: w.rank for w in workers}
        rank_of: dict[int, int] = {}
        ticks: dict[tuple[int, int], int] = {}
        written: dict[tuple[int, int], int] = {}
        out = []
        for st in ordered:
            key = (st.pid, st.start_ticks)
            used = st.utime + st.stime
            ticks[key] = used
            before = self._ticks.get(key)
            cpu = (
                round(100.0 * (used - before) / CLK_TCK / dt, 1)
                if before is not None and dt is not None and dt > 0
                else None
            )
            wrote = written_bytes(st.pid, self.proc_root)
            if wrote is not None:
                written[key] = wrote
            was = self._written.get(key)
            write_bps = (
                round(max(wrote - was, 0) / dt, 1)
                if wrote is not None and was is not None and dt is not None and dt > 0
                else None
            )
            if key not in self._cmd:
                self._cmd[key] = read_cmdline(st.pid, self.proc_root)
            if st.pid in worker_rank:
                rank: int | None = worker_rank[st.pid]
                role = "rank"
            else:
                rank = rank_of.get(st.ppid)
                role = "agent" if st.pid == leader else "child"
            if rank is not None:
                rank_of[st.pid] = rank
            out.append(
                ProcRow(
                    pid=st.pid,
                    ppid=st.ppid,
                    start_ticks=st.start_ticks,
                    role=role,
                    rank=rank,
                    state=st.state,
                    elapsed_s=max(up - st.start_ticks / CLK_TCK, 0.0) if up is not None else 0.0,
                    cmdline=self._cmd[key],
                    cpu_percent=cpu,
                    rss_bytes=st.rss_pages * PAGE_SIZE if st.rss_pages > 0 else None,
                    write_bps=write_bps,
                )
            )
        self._ticks, self._at, self._written = ticks, now, written
        self._cmd = {k: v for k, v in self._cmd.items() if k in ticks}
        return out


def with_gpu(rows: Sequence[ProcRow], gpu: GpuSample | None) -> list[ProcRow]:
    """The rows with what the driver lists for each pid (summed over devices)."""
    if gpu is None or not gpu.available or not rows:
        return list(rows)
    used: dict[int, int] = {}
    util: dict[int, int] = {}
    for g in gpu.processes:
        if g.used_bytes is not None:
            used[g.pid] = used.get(g.pid, 0) + g.used_bytes
        if g.util_percent is not None:
            util[g.pid] = max(util.get(g.pid, 0), g.util_percent)
    if not used and not util:
        return list(rows)
    return [replace(r, gpu_bytes=used.get(r.pid), gpu_util_percent=util.get(r.pid)) for r in rows]
