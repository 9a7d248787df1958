"""The runs overview's rows: one run in one line (state, step, loss, steps/s, worst finding, age),
and their orders. Pure, no Textual."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainroom.core.findings import SEVERITY_RANK
from trainroom.core.run.causes import fold
from trainroom.core.run.figures import pace, run_loss
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.core.vocab import ShownState

from .verdict import STATE_LEVEL, level_of_state

_LEVEL_RANK = {"crit": 4, "warn": 3, "info": 2, "ok": 1, "dim": 0}
MOVING = frozenset({"starting", "running", "slow"})  # states whose steps/s is a rate now
# Interpreter options that take a value (`python -X dev -W error train.py`).
_PY_VALUE_OPTIONS = frozenset({"-X", "-W", "-Q"})
LAUNCHERS = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def short_command(argv: list[str]) -> str:
    """The command as a person names it: its script (or module) and arguments, without the
    interpreter's path and options (`train.py --lr 1e-4`, `torchrun --nproc-per-node=2 train.py`,
    `trainroom.core.demo.train --steps 100`); as given when it is not a Python one."""
    words = list(argv)
    if not words:
        return ""
    head = words[0].rsplit("/", 1)[-1]
    if not head.startswith("python"):
        return " ".join([head, *words[1:]])
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-c"):
        i += 2 if words[i] in _PY_VALUE_OPTIONS else 1
    rest = words[i:]
    if len(rest) >= 2 and rest[0] == "-m":
        module, args = rest[1], rest[2:]
        return " ".join(["torchrun" if module in LAUNCHERS else module, *args])
    if rest and rest[0] == "-c":
        return " ".join(["python -c", *rest[1:]])
    if rest:
        return " ".join([rest[0].rsplit("/", 1)[-1], *rest[1:]])
    return head


@dataclass(frozen=True)
class RunRow:
    run_id: str
    state: ShownState
    keeper: bool  # its keeper lives
    attempt: int | None
    step: int | None
    loss: float | None
    steps_per_s: float | None
    worst_code: str | None
    worst_severity: str | None
    findings: int
    created: float
    command: str
    error: str | None = None  # why the run could not be read
    job: str | None = None  # the job this run is a node of
    nodes: int = 1  # a job's row stands for this many runs (its nodes here)
    training: bool = False  # a trainer runs: what "live" means (a keeper staying after the end is not)
    attached: bool = False  # its attempt is a process `trainroom attach` adopted
    # Where steps/s came from (core/run/figures.Pace): `read times` is only when the log's lines
    # were read, an estimate; the others are the trainer's own timing.
    rate_from: str | None = None

    @property
    def name(self) -> str:
        """What the overview calls it: the run, or the job when the row stands for its nodes."""
        return f"job {self.job} ({self.nodes} nodes)" if self.job and self.nodes > 1 else self.run_id

    @property
    def level(self) -> str:
        return level_of_state(self.state)


def row_of(info: RunInfo, state: RunState, keeper_alive: bool) -> RunRow:
    a = state.attempt
    found = state.open_findings()
    worst = next((r.head for r in fold(found)), None)  # a root cause, never its consequence
    status: ShownState = state.status
    if not keeper_alive and a is not None and a.ended_at is None:
        status = "unknown"  # the keeper died before its trainer: nobody watched the end (as `status`)
    loss = run_loss(state).median
    # A rate only while steps flow: a HUNG, STALLED or dead run shows none (the last one measured
    # would say it still trains).
    moving = pace(state) if a is not None and a.alive and status in MOVING else None
    rate = moving.steps_per_s if moving is not None else None
    return RunRow(
        run_id=info.run_id,
        state=status,
        keeper=keeper_alive,
        training=keeper_alive and a is not None and a.alive,
        attempt=a.n if a else None,
        step=state.current_step() if state.ranks else (a.last_step if a else None),
        loss=loss,
        steps_per_s=rate,
        rate_from=moving.source if moving is not None and rate is not None else None,
        worst_code=worst.code if worst else None,
        worst_severity=worst.severity if worst else None,
        findings=len(found),
        created=info.created,
        command=short_command(info.argv),
        job=state.options.job.name if state.options.job is not None else None,
        attached=a.attached if a else False,
    )


def row_of_summary(info: RunInfo, s: RunSummary) -> RunRow:
    """A finished run's row from the summary its keeper wrote last: no journal read."""
    return RunRow(
        run_id=info.run_id,
        state=s.shown_state(keeper_alive=False),
        keeper=False,
        attempt=s.attempt,
        step=s.step,
        loss=s.loss,
        steps_per_s=None,
        worst_code=s.worst.code if s.worst else None,
        worst_severity=s.worst.severity if s.worst else None,
        findings=s.findings,
        created=info.created,
        command=short_command(info.argv),
        job=s.job,
        attached=s.attached,
    )


def by_job(rows: list[RunRow]) -> list[RunRow]:
    """The nodes of one job as one row: the worst node's state and finding (Enter opens that
    node), the slowest node's step and rate, the worst loss, every node's findings counted."""
    groups: dict[str, list[RunRow]] = {}
    for r in rows:
        if r.job:
            groups.setdefault(r.job, []).append(r)
    out: list[RunRow] = []
    for r in rows:
        nodes = groups.get(r.job or "", [])
        if len(nodes) < 2:
            out.append(r)
        elif r is nodes[0]:
            out.append(_job_row(nodes))
    return out


def _job_row(nodes: list[RunRow]) -> RunRow:
    worst = max(nodes, key=lambda r: (_LEVEL_RANK.get(r.level, 2), _worst_rank(r)))
    steps = [r.step for r in nodes if r.step is not None]
    losses = [r.loss for r in nodes if r.loss is not None and math.isfinite(r.loss)]
    slowest = min(
        (r for r in nodes if r.steps_per_s is not None), key=lambda r: r.steps_per_s or 0.0, default=None
    )
    return dataclasses.replace(
        worst,
        step=min(steps) if steps else None,
        loss=max(losses) if losses else worst.loss,
        steps_per_s=slowest.steps_per_s if slowest is not None else None,
        rate_from=slowest.rate_from if slowest is not None else None,
        findings=sum(r.findings for r in nodes),
        keeper=any(r.keeper for r in nodes),
        training=any(r.training for r in nodes),
        created=min(r.created for r in nodes),
        command="nodes: " + ", ".join(r.run_id for r in nodes),
        nodes=len(nodes),
    )


def unreadable(info: RunInfo, error: str) -> RunRow:
    return RunRow(
        run_id=info.run_id,
        state="unknown",
        keeper=info.alive,
        attempt=None,
        step=None,
        loss=None,
        steps_per_s=None,
        worst_code=None,
        worst_severity=None,
        findings=0,
        created=info.created,
        command=short_command(info.argv),
        error=error,
    )


def _worst_rank(r: RunRow) -> tuple[int, int]:
    sev = SEVERITY_RANK.get(r.worst_severity, -1) if r.worst_severity else -1
    return (sev, r.findings)


# Column -> (sort key, whether the natural order is descending): what a user wants on top.
SORTS: dict[str, tuple[Callable[[RunRow], Any], bool]] = {
    "age": (lambda r: r.created, True),  # newest first
    "state": (
        lambda r: (_LEVEL_RANK.get(STATE_LEVEL.get(r.state, "info"), 2), r.created),
        True,
    ),  # worst first
    "worst": (lambda r: (_worst_rank(r), r.created), True),
    "step": (lambda r: r.step if r.step is not None else -1, True),
    "loss": (lambda r: r.loss if r.loss is not None and math.isfinite(r.loss) else math.inf, False),
    "steps/s": (lambda r: r.steps_per_s or 0.0, True),
    "run": (lambda r: r.run_id, False),
}
SORT_ORDER: tuple[str, ...] = ("age", "state", "worst", "step", "loss", "steps/s", "run")


def matches(r: RunRow, text: str) -> bool:
    """Whether the overview's filter keeps `r`: `text` (any case) in its name, state, worst
    finding or command; every row for no text."""
    if not text:
        return True
    hay = " ".join([r.name, r.state, r.worst_code or "", r.command, r.error or ""]).lower()
    return text.lower() in hay


def ordered(rows: list[RunRow], by: str, reverse: bool = False) -> list[RunRow]:
    key, descending = SORTS[by]
    return sorted(rows, key=key, reverse=descending != reverse)
