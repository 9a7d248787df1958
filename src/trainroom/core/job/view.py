"""The job as one view: the nodes' keepers merged (what `trainroom job --json` prints and the
control room's job screen draws). Pure: each node's state comes in already read (`NodeReading`),
with whether its link is up; nothing here touches a socket or a clock.

- `state`: the worst node's (a node whose link is down is `unreachable`, never `dead`).
- `ranks`: every node's ranks, by global rank, with the node and host they run on.
- `root_cause`: the first observed failure by time across nodes: the earliest rank whose reporter
  connection closed on a failed node (a rank killed outright closes it at once; the ranks it takes
  down with it close theirs later), else the earliest failed attempt's end.
- `hang`: when ranks stop stepping, which ranks did not arrive: the majority waits parked on one
  line (heartbeats flowing, main thread still), a rank that is silent (no heartbeat: stopped,
  frozen, or unreachable) or parked elsewhere, or behind in steps, did not arrive.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainroom.core.remote.link import Reachability
from trainroom.core.run.ended import how_ended
from trainroom.core.run.parts import RankView
from trainroom.core.run.state import RunState
from trainroom.core.run.status import status_dict
from trainroom.core.units import fmt_clock, fmt_duration, signal_name
from trainroom.core.vocab import KeeperWord, NodeState
from trainroom.core.wire import protocol as p

# Worst first: the job's state is the first of these any node is in.
STATE_ORDER: tuple[NodeState, ...] = (
    "dead",
    "failed",
    "orphaned",
    "unknown",
    "hung",
    "stalled",
    "unreachable",
    "slow",
    "starting",
    "running",
    "exited",
)
FAILED: frozenset[NodeState] = frozenset({"dead", "failed", "orphaned", "unknown"})
STOPPED: frozenset[NodeState] = frozenset({"hung", "stalled"})
# A rank whose last heartbeat is older than this is silent (the reporter beats every second).
SILENT_S = 3.0
# A main thread on one line this long, heartbeats flowing, is parked (waiting in a collective).
PARKED_S = 2.0


@dataclass
class NodeReading:
    """One node as last heard: `state` None when it was never heard."""

    target: str  # as given (a local run, ssh://host/RUN, a [hosts] name)
    host: str | None = None
    run: str | None = None
    state: RunState | None = None
    keeper: KeeperWord = "gone"  # alive, busy, gone (its keeper, as its host says)
    reach: Reachability = field(default_factory=Reachability)

    @property
    def node_rank(self) -> int | None:
        job = self.state.options.job if self.state is not None else None
        return job.node_rank if job is not None else None

    @property
    def job(self) -> str | None:
        job = self.state.options.job if self.state is not None else None
        return job.name if job is not None else None


def node_state(n: NodeReading, status: dict[str, Any] | None) -> str:
    if not n.reach.reachable:
        return "unreachable"
    if status is None:
        return "unknown"
    return str(status["state"])


def worst(states: list[str]) -> str:
    if not states:
        return "unknown"
    return min(states, key=lambda s: STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER))


def job_dict(job: str | None, nodes: list[NodeReading], now: float) -> dict[str, Any]:
    statuses = [
        status_dict(n.state, now=now, keeper_alive=n.keeper != "gone") if n.state is not None else None
        for n in nodes
    ]
    node_states = [node_state(n, s) for n, s in zip(nodes, statuses, strict=True)]
    ranks = [
        _rank(n, st, item, r, now)
        for n, st, s in zip(nodes, node_states, statuses, strict=True)
        if s is not None and n.state is not None
        for item, r in _rank_pairs(n.state, s)
    ]
    ranks.sort(key=lambda x: (x["rank"], x["node_rank"] if x["node_rank"] is not None else -1))
    state = worst(node_states)
    out: dict[str, Any] = {
        "job": job or next((n.job for n in nodes if n.job), None),
        "state": state,
        "nodes": [_node(n, st, s, now) for n, st, s in zip(nodes, node_states, statuses, strict=True)],
        "ranks": ranks,
        "root_cause": root_cause(nodes, node_states),
        "findings": [
            {**f, "node": n.target, "node_rank": n.node_rank, "host": n.host}
            for n, s in zip(nodes, statuses, strict=True)
            if s is not None
            for f in s["findings"]
        ],
        "hang": hang_report(ranks, now) if state in STOPPED or _any_parked(ranks) else None,
    }
    out["step"] = _median([r["step"] for r in ranks if r["step"] is not None])
    return out


def _median(values: list[int]) -> float | None:
    return statistics.median(values) if values else None


def _rank_pairs(st: RunState, status: dict[str, Any]) -> list[tuple[dict[str, Any], RankView | None]]:
    """status --json's rank items (the contract: rank, and pid, local_rank, state where the keeper
    knows them) with the fold's rank beside each (heartbeat, main frame, disconnect time)."""
    return [(item, st.ranks.get(int(item["rank"]))) for item in status["ranks"]]


def _rank(
    n: NodeReading, node_st: str, item: dict[str, Any], r: RankView | None, now: float
) -> dict[str, Any]:
    hb_age = now - r.last_heartbeat_t if r is not None and r.last_heartbeat_t is not None else None
    return {
        "rank": item["rank"],
        "node_rank": n.node_rank,
        "local_rank": item.get("local_rank"),
        "host": n.host,
        "node": n.target,
        "pid": item.get("pid", r.pid if r is not None else None),
        "state": _decisive(item.get("state")) or _rank_state(node_st, r, hb_age),
        "step": item.get("step"),
        "loss": item.get("loss"),
        "step_time_s": item.get("step_time_s"),
        "heartbeat_age_s": round(hb_age, 3) if hb_age is not None else None,
        "main_frame": r.main_frame if r is not None else None,
        "main_frame_age_s": r.main_frame_age_s if r is not None else None,
        "disconnected_at": r.disconnected_at if r is not None else None,
    }


# A rank's process state that says more than its reporter's link can: it ended, or it is stopped
# (SIGSTOP, a debugger). "running" or "sleeping" says nothing about a collective: the link does.
_DECISIVE = ("dead", "exited", "gone", "zombie", "stopped", "tracing-stop")
_STOPPED_PROCESS = ("stopped", "tracing-stop")


def _decisive(process_state: object) -> str | None:
    return process_state if isinstance(process_state, str) and process_state in _DECISIVE else None


def _rank_state(node_st: str, r: RankView | None, hb_age: float | None) -> str:
    """Where status --json gives no per-rank state: read one from the reporter's link."""
    if node_st == "unreachable" or r is None:
        return node_st
    if not r.connected:
        return "dead" if node_st in FAILED else "disconnected" if node_st != "exited" else "exited"
    if hb_age is not None and hb_age >= SILENT_S:
        return "silent"
    if r.main_frame_age_s is not None and r.main_frame_age_s >= PARKED_S and node_st in STOPPED:
        return "parked"
    return node_st


def _node(n: NodeReading, st: str, s: dict[str, Any] | None, now: float) -> dict[str, Any]:
    base: dict[str, Any] = {
        "target": n.target,
        "host": n.host,
        "run": n.run,
        "state": st,
        "node_rank": n.node_rank,
        "keeper": n.keeper,
        "reachable": n.reach.reachable,
        "unreachable_since": n.reach.since,
        "link": n.reach.describe(now),
    }
    if s is None:
        return base
    return {
        **base,
        "state_reason": s["state_reason"],
        "attempt": s["attempt"],
        "step": s["step"],
        "exit": s["exit"],
        "vram": s["vram"],
        "host_mem": s["host"],
        "disk": s["disk"],
        "latest_checkpoint": s["latest_checkpoint"],
        "verified_steps": sorted(
            {c["step"] for c in s["checkpoints"] if c["state"] == "verified" and c["step"] is not None}
        ),
    }


def root_cause(nodes: list[NodeReading], states: list[str]) -> dict[str, Any] | None:
    """The first observed failure across the failed nodes, by time (hosts' clocks: a skew between
    machines larger than the gap between two deaths can misorder them; NTP keeps it to ms), a node
    whose trainer raised that its peer went away coming after every other. A rank
    is named only where something says which it is: its process (the workers' environment), its
    reporter, or a node whose trainer held that one rank."""
    found: list[dict[str, Any]] = []
    consequences: set[int] = set()
    for n, st in zip(nodes, states, strict=True):
        if st not in FAILED or n.state is None:
            continue
        a = n.state.attempt
        if a is None:
            continue
        workers = [w for w in n.state.workers.values() if w.attempt == a.n]
        held = {w.rank for w in workers} | {r.rank for r in n.state.ranks.values() if r.attempt == a.n}
        # A node whose one trainer raised "connection closed by peer" failed because another did:
        # a consequence, whichever keeper happened to notice first.
        after_peer = len(held) <= 1 and peer_lost(a.crash)
        start = len(found)
        found += [
            _cause(n, w.rank, w.ended_at, w.exit_signal, w.exit_code, "its process ended", w.pid)
            for w in workers
            if w.failed and w.ended_at is not None and w.pid != a.pid
        ]
        found += [
            _cause(n, r.rank, r.disconnected_at, None, None, "its reporter's connection closed", r.pid)
            for r in n.state.ranks.values()
            if r.attempt == a.n and r.disconnected_at is not None
        ]
        if a.ended_at is not None:
            only = sorted(held) if len(held) == 1 else [None]
            found.append(
                _cause(n, only[0], a.ended_at, a.exit_signal, a.exit_code, "its trainer ended", a.pid)
            )
        if after_peer:
            consequences.update(id(c) for c in found[start:])
    if not found:
        return None
    first = min(found, key=lambda c: (id(c) in consequences, c["t"]))
    if first["signal"] is None and first["exit_code"] is None and first["rank"] is not None:
        # How that rank ended, from its process (else its node's trainer, where it was that one).
        same = [
            c
            for c in found
            if c["node"] == first["node"]
            and c["rank"] == first["rank"]
            and (c["signal"] is not None or c["exit_code"] is not None)
        ]
        if same:
            told = min(same, key=lambda c: c["t"])
            first["signal"], first["exit_code"] = told["signal"], told["exit_code"]
            first["signal_name"] = told["signal_name"]
            first["message"] = _cause(
                _node_of(nodes, first["node"]),
                first["rank"],
                first["t"],
                told["signal"],
                told["exit_code"],
                first["how"],
                first["pid"],
            )["message"]
    return first


# What a collective backend raises in the ranks a dead peer leaves behind (gloo's TCP pair, NCCL's
# remote-error and watchdog messages).
_PEER_LOST = re.compile(
    r"connection (?:closed|reset) by peer|remote process exited|ncclRemoteError|"
    r"socket closed|broken pipe|peer (?:closed|disconnected)",
    re.IGNORECASE,
)


def peer_lost(crash: p.Crash | None) -> bool:
    """The trainer's exception says a peer of its collective went away first."""
    return crash is not None and any(_PEER_LOST.search(link.message[:4096]) for link in crash.chain)


def _node_of(nodes: list[NodeReading], target: str) -> NodeReading:
    return next(n for n in nodes if n.target == target)


def _cause(
    n: NodeReading,
    rank: int | None,
    t: float,
    sig: int | None,
    code: int | None,
    how: str,
    pid: int | None = None,
) -> dict[str, Any]:
    who = f"rank {rank}" if rank is not None else "the trainer"
    where = f"node {n.node_rank}" if n.node_rank is not None else n.target
    ended = f" ({how_ended(code, sig)})" if sig is not None or code is not None else ""
    return {
        "host": n.host,
        "node": n.target,
        "node_rank": n.node_rank,
        "rank": rank,
        "signal": sig,
        "signal_name": signal_name(sig) if sig is not None else None,
        "exit_code": code,
        "pid": pid,
        "t": t,
        "how": how,
        "message": f"{who} on {where} ({n.host or '?'}) failed first, at {fmt_clock(t)}: {how}{ended}"
        + (f", pid {pid}" if pid else ""),
    }


def _any_parked(ranks: list[dict[str, Any]]) -> bool:
    return any(r["state"] in ("parked", "silent", *_STOPPED_PROCESS) for r in ranks)


def hang_report(ranks: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Which ranks did not arrive: compared by where each main thread is (its heartbeat's frame)
    and whether it beats at all. The frame most ranks wait on is the collective."""
    live = [r for r in ranks if r["state"] not in ("dead", "exited", "gone", "zombie", "disconnected")]
    parked = [
        r
        for r in live
        if r["main_frame"] and (r["main_frame_age_s"] or 0) >= PARKED_S and r["state"] != "silent"
    ]
    common = Counter(r["main_frame"] for r in parked).most_common(1)
    waiting_at = common[0][0] if common else None
    top_step = max((r["step"] for r in live if r["step"] is not None), default=None)
    waiting, missing = [], []
    for r in live:
        who = {k: r[k] for k in ("rank", "node_rank", "host", "node", "pid", "step")}
        if r["state"] in _STOPPED_PROCESS:
            missing.append(
                {**who, "why": "its process is stopped (SIGSTOP or a debugger)", "frame": r["main_frame"]}
            )
        elif r["state"] in ("silent", "unreachable"):
            age = r["heartbeat_age_s"]
            why = (
                f"no heartbeat for {fmt_duration(age)} (stopped, frozen or unreachable)"
                if age is not None
                else "never heard"
            )
            missing.append({**who, "why": why, "frame": r["main_frame"]})
        elif waiting_at is not None and r in parked and r["main_frame"] == waiting_at:
            waiting.append({**who, "frame": r["main_frame"], "for_s": r["main_frame_age_s"]})
        elif waiting_at is not None and r["main_frame"] != waiting_at:
            missing.append(
                {
                    **who,
                    "why": f"elsewhere: {r['main_frame'] or 'no frame sampled'}",
                    "frame": r["main_frame"],
                }
            )
        elif top_step is not None and r["step"] is not None and r["step"] < top_step:
            missing.append(
                {**who, "why": f"behind: step {r['step']} of {top_step}", "frame": r["main_frame"]}
            )
    summary = "; ".join(
        [f"rank {m['rank']} (node {m['node_rank']}, {m['host']}) did not arrive: {m['why']}" for m in missing]
        + ([f"rank(s) {', '.join(str(w['rank']) for w in waiting)} wait at {waiting_at}"] if waiting else [])
    )
    return {
        "waiting_at": waiting_at,
        "waiting": waiting,
        "not_arrived": missing,
        "summary": summary or "no rank stands out: every rank is where the others are",
    }
