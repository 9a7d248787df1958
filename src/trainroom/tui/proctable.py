"""The processes screen's rows (nvitop's process table), computed from the keeper's probe: every
process of the live attempt as a tree (agent -> rank workers -> their children), each with its
figures in words and units. Pure: no Textual; the screen draws what this returns.

Sorting keeps the tree (a child stays under its parent): siblings are ordered by the chosen key,
as a person reading "which rank eats the CPU" still wants to see whose DataLoader workers those are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainroom.core.run.state import RunState
from trainroom.core.samples import ProcRow

from . import fmt

UNKNOWN = fmt.UNKNOWN

# Sort keys: name -> (the value a row sorts by, descending first). "tree" is the pid order.
SORTS: dict[str, tuple[Callable[[ProcRow], float], bool]] = {
    "tree": (lambda r: float(r.pid), False),
    "cpu": (lambda r: r.cpu_percent if r.cpu_percent is not None else -1.0, True),
    "rss": (lambda r: float(r.rss_bytes or -1), True),
    "gpu": (lambda r: float(r.gpu_bytes if r.gpu_bytes is not None else -1), True),
    "elapsed": (lambda r: r.elapsed_s, True),
    "pid": (lambda r: float(r.pid), False),
}
SORT_KEYS = tuple(SORTS)
COLUMNS = ("pid", "rank", "cpu %", "rss", "gpu mem", "gpu %", "st", "elapsed", "command")
SORT_COLUMN = {"cpu": "cpu %", "rss": "rss", "gpu": "gpu mem", "elapsed": "elapsed", "pid": "pid"}


@dataclass(frozen=True)
class ProcLine:
    pid: int
    start_ticks: int
    depth: int
    role: str
    rank: int | None
    label: str  # how a signal's confirmation names it: `pid 4243 (rank 1)`
    cells: tuple[str, ...]  # as COLUMNS


@dataclass(frozen=True)
class ProcsView:
    lines: tuple[ProcLine, ...]
    title: str  # what the rows are, in one line
    note: str | None  # why a column shows "—" (no driver), said once


def _rank(r: ProcRow) -> str:
    if r.role == "agent":
        return "agent"
    if r.rank is None:
        return UNKNOWN
    return str(r.rank) if r.role == "rank" else f"({r.rank})"


def label_of(r: ProcRow) -> str:
    if r.role == "rank":
        return f"pid {r.pid} (rank {r.rank})"
    if r.role == "agent":
        return f"pid {r.pid} (the trainer's leader)"
    return f"pid {r.pid} (a child of rank {r.rank})" if r.rank is not None else f"pid {r.pid} (a child)"


def _cells(r: ProcRow, depth: int, gpu_known: bool) -> tuple[str, ...]:
    branch = "  " * max(depth - 1, 0) + ("└─ " if depth else "")
    return (
        str(r.pid),
        _rank(r),
        f"{r.cpu_percent:.1f}" if r.cpu_percent is not None else UNKNOWN,
        fmt.nbytes(r.rss_bytes),
        fmt.nbytes(r.gpu_bytes) if gpu_known and r.gpu_bytes is not None else UNKNOWN,
        str(r.gpu_util_percent) if gpu_known and r.gpu_util_percent is not None else UNKNOWN,
        r.state,
        fmt.duration(r.elapsed_s),
        branch + " ".join(r.cmdline or ["?"]),
    )


def ordered(rows: list[ProcRow], sort: str, reverse: bool = False) -> list[tuple[ProcRow, int]]:
    """The rows as a tree (parents first), siblings by `sort`; with their depth."""
    key, descending = SORTS.get(sort, SORTS["tree"])
    pids = {r.pid for r in rows}
    kids: dict[int | None, list[ProcRow]] = {}
    for r in rows:
        kids.setdefault(r.ppid if r.ppid in pids and r.ppid != r.pid else None, []).append(r)
    for group in kids.values():
        group.sort(key=lambda r: (key(r), -r.pid), reverse=descending != reverse)
    out: list[tuple[ProcRow, int]] = []
    todo = [(r, 0) for r in reversed(kids.get(None, []))]
    while todo:
        r, depth = todo.pop()
        out.append((r, depth))
        todo += [(c, depth + 1) for c in reversed(kids.get(r.pid, []))]
    return out


def procs_view(state: RunState | None, sort: str = "tree", reverse: bool = False) -> ProcsView:
    """What the processes screen shows of `state` now."""
    a = state.attempt if state is not None else None
    probe = state.probe if state is not None else None
    procs = probe.procs if probe is not None else None
    if state is None or a is None or not a.alive:
        why = "no attempt has started" if a is None else f"attempt {a.n} has ended"
        return ProcsView((), f"processes: none running ({why})", None)
    rows = list(procs.table) if procs is not None else []
    if procs is not None and procs.error:
        return ProcsView((), "processes: unreadable", f"the process probe failed: {procs.error}")
    gpu = probe.gpu if probe is not None else None
    gpu_known = gpu is not None and gpu.available
    note = None
    if gpu is None:
        note = "gpu columns: no driver reading yet"
    elif not gpu.available:
        note = f"gpu columns: {gpu.reason or 'driver view unavailable'}"
    elif gpu.per_process is False:
        note = "gpu columns: per-process GPU memory is N/A from this driver (WSL2/WDDM or MIG)"
    lines = tuple(
        ProcLine(
            pid=r.pid,
            start_ticks=r.start_ticks,
            depth=depth,
            role=r.role,
            rank=r.rank,
            label=label_of(r),
            cells=_cells(r, depth, gpu_known),
        )
        for r, depth in ordered(rows, sort, reverse)
    )
    ranks = sum(1 for r in rows if r.role == "rank")
    title = f"processes of attempt {a.n}: {len(rows)}" + (f", {ranks} rank(s)" if ranks else "")
    if not rows:
        title += " (waiting for the keeper's next probe)"
    return ProcsView(lines, title, note)
