"""Job-wide actions, each through every node's keeper, the way a local one goes: plan, show,
confirm with exactly that plan (the keeper refuses if its target moved), evidence back.

- kill: every node's `kill` (each checked as a local kill is: the group gone, VRAM falling).
- resume: every node from the same verified step, or none: refused when the nodes' resume points
  differ, naming the node that lacks the step the others would resume from.
- stacks: every rank's `dump` through its node's keeper (faulthandler, or py-spy for a stopped
  rank; the NCCL flight recorder triggered where the trainer enabled it), then compared: where
  each main thread is parked, and which ranks are not where the others wait.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from trainroom.core.job.nodes import NodeRef, address_of
from trainroom.core.job.view import NodeReading
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.vocab import ActionName
from trainroom.core.wire import protocol as p

T = TypeVar("T")
U = TypeVar("U")


@dataclass
class NodeAction:
    """One node's part: its plan (None: refused before planning) and its outcome."""

    node: str
    node_rank: int | None
    host: str | None
    address: str | None
    plan: p.Reply | None = None
    done: p.Reply | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.done is not None and self.done.ok

    def as_dict(self) -> dict[str, Any]:
        r = self.done or self.plan
        return {
            "node": self.node,
            "node_rank": self.node_rank,
            "host": self.host,
            "ok": self.ok,
            "message": self.error or (r.message if r is not None else ""),
            "plan": self.plan.plan if self.plan is not None else {},
            "before": self.done.before if self.done is not None else {},
            "after": self.done.after if self.done is not None else {},
        }


@dataclass
class JobAction:
    action: ActionName
    nodes: list[NodeAction] = field(default_factory=list)
    refusal: str | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None and all(n.ok for n in self.nodes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "ok": self.ok,
            "refusal": self.refusal,
            "nodes": [n.as_dict() for n in self.nodes],
        }


def each(fn: Callable[[T], U], items: list[T]) -> list[U]:
    """`fn` over `items` at once (a thread each, 16 at most), in their order."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(items)))) as pool:
        return list(pool.map(fn, items))


def plan(
    action: ActionName, refs: list[NodeRef], readings: list[NodeReading], args: dict[str, Any]
) -> JobAction:
    """Ask every node's keeper for its plan (nothing runs yet)."""
    job = JobAction(action)
    for ref, n in zip(refs, readings, strict=True):
        job.nodes.append(NodeAction(n.target, n.node_rank, n.host, address_of(ref, n)))

    def ask(na: NodeAction, n: NodeReading) -> None:
        if not n.reach.reachable:
            na.error = f"{action} not planned: {n.reach.error}"
        elif n.keeper != "alive" or na.address is None:
            na.error = f"{action} not planned: the keeper of {n.run} on {n.host or n.target} is {n.keeper}"
        else:
            try:
                na.plan = KeeperClient(na.address, timeout_s=20.0).call(action, args, confirm=False)
            except KeeperGone as exc:
                na.error = f"{action} not planned: {exc}"
                return
            if na.plan.stage != "plan":
                na.error = na.plan.message

    each(lambda pair: ask(*pair), list(zip(job.nodes, readings, strict=True)))
    if action == "resume":
        job.refusal = _resume_refusal(job)
    return job


class ResumesFrom(msgspec.Struct):
    """What a job reads of a node's resume plan (the action's own `Target` lives in actions/,
    above this layer): the checkpoint's step."""

    step: int | None = None


def _step(plan: dict[str, Any]) -> int | None:
    try:
        return msgspec.convert(plan, ResumesFrom, strict=False).step
    except msgspec.ValidationError:
        return None  # a plan of another shape (another version's keeper): no step known


def _resume_refusal(job: JobAction) -> str | None:
    """Every node resumes from the same step, or none does: the step the most nodes would
    resume from, and the nodes that lack it (their newest verified step said)."""
    steps = {na.node: _step(na.plan.plan) for na in job.nodes if na.plan is not None and na.error is None}
    if not steps:
        return None
    counted = Counter(steps.values()).most_common()
    step = (
        max(s for s, _n in counted if s is not None) if any(s is not None for s in steps.values()) else None
    )
    lacking = [
        f"node {na.node_rank if na.node_rank is not None else na.node} ({na.host}) lacks step {step} "
        f"(its newest verified is {steps[na.node] if steps[na.node] is not None else 'none'})"
        for na in job.nodes
        if na.node in steps and steps[na.node] != step
    ]
    if lacking:
        return f"resume refused: the nodes' verified steps differ: {'; '.join(lacking)}"
    return None


def carry_out(job: JobAction, args: dict[str, Any]) -> JobAction:
    """Run each node's planned action with the plan it showed (the keeper refuses, naming the
    difference, if its target moved)."""

    def run(na: NodeAction) -> None:
        if na.plan is None or na.error is not None or na.address is None:
            return
        try:
            na.done = KeeperClient(na.address, timeout_s=20.0).call(
                job.action, p.confirming(args, na.plan.plan), confirm=True
            )
        except KeeperGone as exc:
            na.error = f"{job.action}: {exc}"

    if job.refusal is None:
        each(run, job.nodes)
    return job


# --------------------------------------------------------------------------- stacks

# py-spy: `Thread 123 (active): "MainThread"` then `    func (file.py:12)` lines;
# faulthandler: `Current thread 0x... (most recent call first):` then `  File "x.py", line 12 in func`.
_PYSPY_MAIN = re.compile(r'^Thread \S+ \([^)]*\): "MainThread"')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^:()]+):(?P<line>\d+)\)")
_FH_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def main_thread_frames(stacks: str) -> list[str]:
    """The main thread's frames, innermost first, as `func (file:line)`; from a py-spy or a
    faulthandler dump (faulthandler names no thread: its main thread is the last block, the one
    the heartbeat thread is not)."""
    lines = stacks.splitlines()
    for i, line in enumerate(lines):
        if _PYSPY_MAIN.match(line):
            out = []
            for f in lines[i + 1 :]:
                m = _PYSPY_FRAME.match(f)
                if not m:
                    break
                out.append(f"{m['func']} ({m['file']}:{m['line']})")
            return out
    blocks: list[list[str]] = []
    for line in lines:
        if _FH_HEAD.match(line):
            blocks.append([])
        elif blocks and (m := _FH_FRAME.match(line)):
            blocks[-1].append(f"{m['func']} ({m['file']}:{m['line']})")
    candidates = [b for b in blocks if b and not any("reporter" in f or "_heartbeat" in f for f in b)]
    return candidates[-1] if candidates else (blocks[-1] if blocks else [])


def _short(frame: str) -> str:
    """`func (/a/b/file.py:12)` as `func (file.py:12)`."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.rsplit('/', 1)[-1]}" if where else frame


def parked_at(frames: list[str]) -> str | None:
    """Where a main thread waits: its innermost frame in the trainer's own code (not in an
    installed package or the standard library), with the innermost call it is parked in."""
    for i, f in enumerate(frames):
        if "site-packages" not in f and "/lib/python" not in f and not f.startswith("<"):
            inner = frames[0].split(" (", 1)[0] if i > 0 else None
            return f"{_short(f)} → {inner}" if inner else _short(f)
    return _short(frames[0]) if frames else None


def compare_stacks(dumps: list[dict[str, Any]]) -> dict[str, Any]:
    """Where each rank's main thread is, and which ranks are not where most wait."""
    for d in dumps:
        d["frames"] = main_thread_frames(d.get("stacks") or "")[:16]
        d["parked_at"] = parked_at(d["frames"])
    # A stopped rank (SIGSTOP, a debugger) arrived nowhere, wherever it stopped: it does not vote.
    known = [d["parked_at"] for d in dumps if d["parked_at"] and not d.get("stopped")]
    common = Counter(known).most_common(1)[0][0] if known else None
    odd = [d for d in dumps if d["parked_at"] != common or d.get("stopped")]
    return {
        "waiting_at": common,
        "ranks": dumps,
        "not_arrived": [
            {
                "rank": d["rank"],
                "node_rank": d["node_rank"],
                "host": d["host"],
                "parked_at": d["parked_at"],
                "stopped": bool(d.get("stopped")),
                "why": d["message"],
            }
            for d in odd
        ],
    }


def dump_ranks(refs: list[NodeRef], readings: list[NodeReading]) -> dict[str, Any]:
    """Every connected rank's stacks through its node's keeper, compared."""
    jobs: list[tuple[str, int, NodeReading]] = []
    for ref, n in zip(refs, readings, strict=True):
        address = address_of(ref, n)
        if n.state is None or address is None or n.keeper != "alive" or not n.reach.reachable:
            continue
        jobs += [(address, r.rank, n) for r in n.state.ranks.values() if r.connected]

    def one(item: tuple[str, int, NodeReading]) -> dict[str, Any]:
        address, rank, n = item
        out: dict[str, Any] = {"rank": rank, "node_rank": n.node_rank, "host": n.host, "node": n.target}
        try:
            reply = KeeperClient(address, timeout_s=30.0).confirmed("dump", {"rank": rank}, timeout_s=60.0)
        except KeeperGone as exc:
            return {**out, "ok": False, "message": str(exc), "stacks": ""}
        return dump_entries(out, reply.ok, reply.message, reply.after)[0]

    return compare_stacks(each(one, jobs))


def dump_entries(base: dict[str, Any], ok: bool, message: str, after: dict[str, Any]) -> list[dict[str, Any]]:
    """A dump action's result as `compare_stacks` entries, each on top of `base` (rank, node,
    host): one, or one per rank where the keeper dumped each of a torchrun node's workers."""
    blocks = after.get("ranks") or [after]
    return [
        {
            **base,
            "rank": b.get("rank", base.get("rank")),
            "ok": ok,
            "message": str(b.get("message") or message),
            "method": b.get("method"),
            "stopped": bool(b.get("stopped")),
            "stacks": b.get("stacks") or "",
            "flight_recorder": after.get("flight_recorder"),
        }
        for b in blocks
    ]


def stacks_lines(report: dict[str, Any]) -> list[str]:
    """`compare_stacks`' report for a person: where most ranks wait, each rank, who did not arrive."""
    out = [f"most ranks wait at: {report['waiting_at'] or 'no common frame'}"]
    for d in report["ranks"]:
        fr = d.get("flight_recorder") or {}
        out.append(
            f"rank {d['rank']} (node {d['node_rank']}, {d['host']}): {d['parked_at'] or '?'}  "
            f"[{d.get('method') or d['message']}{', stopped' if d.get('stopped') else ''}]"
        )
        if fr:
            out.append(f"    flight recorder: {fr.get('detail')}")
    out += [
        f"did not arrive: rank {m['rank']} (node {m['node_rank']}, {m['host']}): "
        + (
            "stopped (it runs no code until SIGCONT)" + (f", at {m['parked_at']}" if m["parked_at"] else "")
            if m.get("stopped")
            else m["parked_at"] or m["why"]
        )
        for m in report["not_arrived"]
    ]
    return out
