"""Whose process is this: the one place that reads a process's run, attempt and rank.

The keeper puts TRAINROOM_RUN and TRAINROOM_ATTEMPT in every attempt's environment (children and
torchrun's workers inherit them), and torchrun adds RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
LOCAL_WORLD_SIZE and its restart budget; Lightning's own launcher gives the processes it starts
LOCAL_RANK, NODE_RANK and WORLD_SIZE but no RANK. /proc/<pid>/environ is the environment the process was started with (readable for our
own uid), so what it says cannot be changed later by the process. Who reads it: the keeper's
server (may this pid report for the live attempt?), the members of a kill or resume (is this
process proven the run's?), the leftovers probe (a process of the run no live attempt owns) and
the workers probe (which rank is this process?).
"""

from __future__ import annotations

from typing import NamedTuple

PROC = "/proc"

_KEYS = (
    b"TRAINROOM_RUN",
    b"TRAINROOM_ATTEMPT",
    b"RANK",
    b"LOCAL_RANK",
    b"WORLD_SIZE",
    b"GROUP_RANK",
    b"NODE_RANK",
    b"LOCAL_WORLD_SIZE",
    b"TORCHELASTIC_RESTART_COUNT",
    b"TORCHELASTIC_MAX_RESTARTS",
)


class RunOf(NamedTuple):
    """What a process's starting environment says of the run it belongs to (None: not said)."""

    run: str | None
    attempt: int | None
    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    restarts_left: int | None = None  # torch elastic's max restarts less this one's count
    node_rank: int | None = None  # GROUP_RANK (torchrun), else NODE_RANK (Lightning)
    local_world_size: int | None = None  # LOCAL_WORLD_SIZE: ranks on this node
    restart_count: int | None = None  # TORCHELASTIC_RESTART_COUNT: the group's restarts so far

    def global_rank(self, local_world_size: int | None = None) -> int | None:
        """RANK where the launcher set it; else node rank x ranks per node + LOCAL_RANK (the
        ranks per node from LOCAL_WORLD_SIZE, else `local_world_size` as counted by the caller).
        None when that cannot be told: never a guessed 0."""
        if self.rank is not None:
            return self.rank
        if self.local_rank is None:
            return None
        if self.node_rank in (None, 0):
            return self.local_rank if self.node_rank == 0 else None
        per_node = self.local_world_size or local_world_size
        return self.node_rank * per_node + self.local_rank if per_node else None


class Unreadable(NamedTuple):
    """The environment could not be read (the process is gone, or not ours)."""

    error: str


def _int(v: bytes | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        return None


def run_of_checked(pid: int, proc_root: str = PROC) -> RunOf | Unreadable:
    """`run_of`, or why the environment could not be read."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError as exc:
        return Unreadable(str(exc.strerror or exc))
    found: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key in _KEYS:
            found[key] = value
    run = found.get(b"TRAINROOM_RUN")
    most, done = _int(found.get(b"TORCHELASTIC_MAX_RESTARTS")), _int(found.get(b"TORCHELASTIC_RESTART_COUNT"))
    return RunOf(
        run=run.decode("utf-8", "replace") if run is not None else None,
        attempt=_int(found.get(b"TRAINROOM_ATTEMPT")),
        rank=_int(found.get(b"RANK")),
        local_rank=_int(found.get(b"LOCAL_RANK")),
        world_size=_int(found.get(b"WORLD_SIZE")),
        restarts_left=max(0, most - done) if most is not None and done is not None else None,
        node_rank=_int(found.get(b"GROUP_RANK", found.get(b"NODE_RANK"))),
        local_world_size=_int(found.get(b"LOCAL_WORLD_SIZE")),
        restart_count=done,
    )


def run_of(pid: int, proc_root: str = PROC) -> RunOf | None:
    """The run, attempt and rank `pid` was started for; None when its environment cannot be read
    (then it is proven nobody's)."""
    found = run_of_checked(pid, proc_root)
    return found if isinstance(found, RunOf) else None
