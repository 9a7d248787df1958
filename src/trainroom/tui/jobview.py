"""What the job screen draws, computed from core's merged job view (`core.job.view.job_dict`, the
same one `trainroom job --json` prints). Pure: frozen rows of text and levels, so the screen only
lays them out and a test reads them without a terminal.

A level is one of the panels' drawing levels (ok, info, warn, crit, dim): the theme gives each its
colour. A node whose link is down is `unreachable` (warn: the node may live on behind it), never
dead.

A Slurm job's view (`trainroom job slurm:JOBID --tui`) carries Slurm's side under "slurm" (core's
`core.job.slurm.slurm_view`, as `--json` prints it): the header's Slurm line (state and reason,
time left against the limit, restarts, a requeued job's eligibility countdown), each node's Slurm
state beside its keepers, and Slurm's verdicts (NODE_LOST, the job's end) among the findings.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from trainroom.core.vocab import SHOWN_STATES, Level

from . import fmt
from .verdict import SEVERITY_LEVEL, SEVERITY_WORD, level_of_state

NODE_COLUMNS = ("node", "state", "host", "step", "VRAM used", "host RAM free", "disk", "link / run")
SLURM_NODE_COLUMNS = (*NODE_COLUMNS[:3], "Slurm", *NODE_COLUMNS[3:])
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
    slurm: SlurmHead | None = None  # a Slurm job's own state, as slurmctld says it


@dataclass(frozen=True)
class SlurmHead:
    job_id: str
    state: str  # JobState ("?" when slurmctld no longer knows the job)
    level: Level
    reason: str | None  # Reason (why it waits or ended)
    words: str | None  # what the state means, in words
    time_left: str | None  # "12m00s left of 1h00m" (None: no limit, or not known)
    restarts: str
    eligible_in: str | None  # a requeued job's wait until slurmctld lets it start
    note: str | None  # why slurmctld could not be asked (the last answer is shown)

    def line(self) -> str:
        """Most telling first (a narrow terminal cuts the end): state and reason, the requeue
        wait, restarts, time left, then the state in words."""
        parts = [f"slurm {self.job_id} {self.state}" + (f" ({self.reason})" if self.reason else "")]
        if self.eligible_in is not None:
            parts.append(f"eligible to start in {self.eligible_in} (requeue wait)")
        parts.append(f"restarts {self.restarts}")
        if self.time_left is not None:
            parts.append(self.time_left)
        if self.words is not None:
            parts.append(self.words)
        if self.note is not None:
            parts.append(self.note)
        return " · ".join(parts)


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
    slurm: str | None = None  # the node's Slurm state (and why it is DOWN or DRAINED); None: no Slurm
    slurm_level: Level = "dim"

    def cells(self) -> tuple[str, ...]:
        return (
            self.node,
            self.state,
            self.host,
            *(() if self.slurm is None else (self.slurm,)),
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
    notes: tuple[Note, ...]  # a lost node, the hang report, each node's findings, the job's end
    node_columns: tuple[str, ...] = NODE_COLUMNS


def _or_unknown(x: object) -> str:
    return str(x) if x is not None else fmt.UNKNOWN


def _node_rank(n: object) -> str:
    return str(n) if n is not None else "?"


def _node(n: dict[str, Any], slurm_nodes: dict[str, dict[str, Any]] | None) -> NodeRow:
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
        **(_slurm_node(slurm_nodes.get(str(n["host"]))) if slurm_nodes is not None else {}),
    )


def _slurm_node(sn: dict[str, Any] | None) -> dict[str, Any]:
    """A node's Slurm state for its row: DOWN*/DRAIN with slurmctld's reason, at crit."""
    if sn is None:
        return {"slurm": "not in the job", "slurm_level": "dim"}
    why = f": {sn['reason']}" if sn.get("reason") else ""
    return {"slurm": f"{sn['state']}{why}", "slurm_level": "crit" if sn.get("down") else "ok"}


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


def _verdict(v: dict[str, Any]) -> Note:
    sev = str(v.get("severity") or "critical")
    return Note(
        SEVERITY_LEVEL.get(sev, "crit"), f"{SEVERITY_WORD.get(sev, sev.upper())} {v['code']}", v["message"]
    )


def _notes(d: dict[str, Any]) -> tuple[Note, ...]:
    verdicts = (d.get("slurm") or {}).get("verdicts") or []
    # A lost node is the cause of what its ranks show (a hang, a dead peer): it comes first.
    out = [_verdict(v) for v in verdicts if v["code"] == "NODE_LOST"]
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
    out += [_verdict(v) for v in verdicts if v["code"] != "NODE_LOST"]
    return tuple(out)


SLURM_LIVE_LEVEL: dict[str, Level] = {
    "RUNNING": "ok",
    "COMPLETING": "ok",
    "PENDING": "info",
    "CONFIGURING": "info",
    "REQUEUED": "info",
    "SUSPENDED": "warn",
}


def slurm_head(s: dict[str, Any]) -> SlurmHead:
    """The header's Slurm line, from core's `slurm_view`."""
    j = s.get("job")
    failed = s.get("refresh_error")
    note = (
        f"last refresh failed: {failed}"
        if failed
        else (f"slurmctld: {s['error']}" if s.get("error") else None)
    )
    if j is None:
        return SlurmHead(
            job_id=str(s["job_id"]),
            state="?",
            level="warn",
            reason=None,
            words="slurmctld does not know the job (purged after MinJobAge?): read from the runs here",
            time_left=None,
            restarts=fmt.UNKNOWN,
            eligible_in=None,
            note=note,
        )
    state = str(j["state"])
    ends = [v for v in s["verdicts"] if v["code"] == f"SLURM_{state}"]
    level = SEVERITY_LEVEL.get(str(ends[0].get("severity")), "crit") if ends else None
    left = j.get("time_left_s")
    limit = j.get("time_limit_s")
    return SlurmHead(
        job_id=str(s["job_id"]),
        state=state,
        level=level or SLURM_LIVE_LEVEL.get(state, "warn"),
        reason=j.get("reason"),
        words=s.get("state_words"),
        time_left=(
            f"{fmt.duration(left)} left of {fmt.duration(limit)}"
            if left is not None and state not in ("PENDING", "REQUEUED") and not ends
            else (f"limit {fmt.duration(limit)}" if limit is not None else None)
        ),
        restarts=str(j["restarts"]) if j.get("restarts") is not None else fmt.UNKNOWN,
        eligible_in=fmt.duration(s["eligible_in_s"]) if s.get("eligible_in_s") is not None else None,
        note=note,
    )


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
        slurm=slurm_head(d["slurm"]) if d.get("slurm") else None,
    )
    slurm_nodes = {str(n["node"]): n for n in d["slurm"]["nodes"]} if d.get("slurm") else None
    return JobScreenView(
        head=head,
        nodes=tuple(_node(n, slurm_nodes) for n in d["nodes"]),
        ranks=tuple(_rank(r) for r in d["ranks"]),
        notes=_notes(d),
        node_columns=SLURM_NODE_COLUMNS if slurm_nodes is not None else NODE_COLUMNS,
    )
