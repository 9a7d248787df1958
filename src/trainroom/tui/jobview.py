"""What the job screen draws, computed from core's merged job view (`core.job.view.job_dict`, the
same one `trainroom job --json` prints). Pure: frozen rows of text and levels, so the screen only
lays them out and a test reads them without a terminal.

A level is one of the panels' drawing levels (ok, info, warn, crit, dim): the theme gives each its
colour. A node whose link is down is `unreachable` (warn: the node may live on behind it), never
dead.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from trainroom.core.vocab import SHOWN_STATES, Level

from . import fmt
from .verdict import SEVERITY_LEVEL, SEVERITY_WORD, level_of_state

NODE_COLUMNS = ("node", "state", "host", "step", "VRAM used", "host RAM free", "disk", "link / run")
RANK_COLUMNS = ("rank", "node", "host", "pid", "state", "step", "heartbeat")


def state_level(state: str) -> Level:
    if state == "unreachable":
        return "warn"
    return level_of_state(state) if state in SHOWN_STATES else "warn"


@dataclass(frozen=True)
class JobHead:
    job: str
    state: str
    level: Level
    nodes: int
    ranks: int
    step_median: float | None  # over the ranks that have stepped
    step_worst: int | None  # the slowest rank's step
    first_failure: str | None  # the job's root cause, as one sentence


@dataclass(frozen=True)
class NodeRow:
    node: str  # its node rank, "?" before it said one
    state: str
    level: Level
    host: str
    step: str
    vram_used: str
    host_free: str
    disk: str
    link: str  # "unreachable since T" while its link is down, else its run and target
    reachable: bool
    run: str | None

    def cells(self) -> tuple[str, ...]:
        return (
            self.node,
            self.state,
            self.host,
            self.step,
            self.vram_used,
            self.host_free,
            self.disk,
            self.link,
        )


@dataclass(frozen=True)
class RankRow:
    rank: str
    node: str
    host: str
    pid: str
    state: str
    level: Level
    step: str
    heartbeat: str

    def cells(self) -> tuple[str, ...]:
        return (self.rank, self.node, self.host, self.pid, self.state, self.step, self.heartbeat)


@dataclass(frozen=True)
class Note:
    level: Level
    label: str  # "hang", or a finding's severity and code
    text: str


@dataclass(frozen=True)
class JobScreenView:
    head: JobHead
    nodes: tuple[NodeRow, ...]
    ranks: tuple[RankRow, ...]
    notes: tuple[Note, ...]  # the hang report first, then each node's findings


def _or_unknown(x: object) -> str:
    return str(x) if x is not None else fmt.UNKNOWN


def _node_rank(n: object) -> str:
    return str(n) if n is not None else "?"


def _node(n: dict[str, Any]) -> NodeRow:
    vram = n.get("vram") or {}
    host = n.get("host_mem") or {}
    disk = n.get("disk") or {}
    state = str(n["state"])
    return NodeRow(
        node=_node_rank(n["node_rank"]),
        state=state,
        level=state_level(state),
        host=n["host"] or "?",
        step=_or_unknown(n.get("step")),
        vram_used=fmt.nbytes(vram.get("driver_used_bytes")),
        host_free=fmt.nbytes(host.get("mem_available_bytes")),
        disk=fmt.percent(disk.get("used_fraction")),
        link=str(n["link"]) if not n["reachable"] else f"{n['run'] or '?'}  {n['target']}",
        reachable=bool(n["reachable"]),
        run=n["run"],
    )


def _rank(r: dict[str, Any]) -> RankRow:
    state = str(r["state"])
    age = r["heartbeat_age_s"]
    return RankRow(
        rank=str(r["rank"]),
        node=_node_rank(r["node_rank"]),
        host=r["host"] or "?",
        pid=str(r["pid"] or fmt.UNKNOWN),
        state=state,
        level=state_level(state),
        step=_or_unknown(r["step"]),
        heartbeat=f"{fmt.duration(age)} ago" if age is not None else fmt.UNKNOWN,
    )


def _notes(d: dict[str, Any]) -> tuple[Note, ...]:
    out = []
    if d["hang"] is not None:
        out.append(Note("warn", "hang", str(d["hang"]["summary"])))
    for f in d["findings"]:
        sev = str(f["severity"])
        out.append(
            Note(
                SEVERITY_LEVEL.get(sev, "info"),
                f"{SEVERITY_WORD.get(sev, sev.upper())} {f['code']}",
                f"node {_node_rank(f['node_rank'])} ({f['host'] or '?'}): {f['message']}",
            )
        )
    return tuple(out)


def job_screen_view(d: dict[str, Any]) -> JobScreenView:
    """The job screen's view of `job_dict`'s output."""
    steps = [r["step"] for r in d["ranks"] if r["step"] is not None]
    rc = d["root_cause"]
    state = str(d["state"])
    head = JobHead(
        job=d["job"] or "?",
        state=state,
        level=state_level(state),
        nodes=len(d["nodes"]),
        ranks=len(d["ranks"]),
        step_median=statistics.median(steps) if steps else None,
        step_worst=min(steps) if steps else None,
        first_failure=str(rc["message"]) if rc is not None else None,
    )
    return JobScreenView(
        head=head,
        nodes=tuple(_node(n) for n in d["nodes"]),
        ranks=tuple(_rank(r) for r in d["ranks"]),
        notes=_notes(d),
    )
