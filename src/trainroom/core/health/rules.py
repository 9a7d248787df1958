"""Every finding rule, listed once.

A rule is a name (the `Guard`'s part name, which is also its failpoint and the key of the
INTERNAL_ERROR it becomes when it raises) and a judgement: a pure function of what it observes
and `now` that returns its findings (None for none). Bodies live in the module named for what
they judge (life, progress, gpu, host, crash, keeper, statedisk, the sanity detectors); this
module only lists them, in the order their findings are reported, in three groups by what they
read:

- `WATCHDOG`: the run's fold, the latest probe results and the watchdog's memory (`Watched`);
- `SANITY`: one attempt's sanity detectors (`detectors.Detectors`), fed step by step;
- `KEEPER`: what the keeper knows of itself (`KeeperFacts`): its journal, its state disk, the
  rank claims it refused, the checkpoint pipeline's own findings.

`judge` runs a group through a guard: one rule that raises is an INTERNAL_ERROR finding and every
other rule still judges. Adding a rule: its body in its module, one line here, its code in the
vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.completeness import ckpt_incomplete
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.health.crash import attempt_masked_error, repeat_death
from trainroom.core.health.detectors import Detectors
from trainroom.core.health.gpu import ghost_finding, ghost_measure, orphan_findings
from trainroom.core.health.gpufaults import ecc_findings, gpu_event_findings, link_findings, throttle_findings
from trainroom.core.health.guard import Guard
from trainroom.core.health.host import duplicate_findings, host_ram_low_now, stale_locks
from trainroom.core.health.keeper import (
    fields_refused,
    journal_write_failed,
    rank_claimed,
    resume_from_scratch,
)
from trainroom.core.health.ranks import rank_outlier_findings, rank_restarted
from trainroom.core.health.statedisk import StateDisk, state_disk_low
from trainroom.core.journal.file import JournalHealth
from trainroom.core.run.state import RunState

T = TypeVar("T")
Judged = Iterable[Finding | None]


@dataclass(frozen=True)
class Rule(Generic[T]):
    """One rule: its part name and its judgement over an observation `T` at `now`."""

    name: str
    judge: Callable[[T, float], Judged]


@dataclass(frozen=True)
class Watched:
    """What a watchdog rule reads: the run, the latest probe results, the watchdog's memory."""

    run: RunState
    ctx: WatchContext
    memory: Memory


@dataclass(frozen=True)
class KeeperFacts:
    """What a keeper rule reads of the keeper itself (gathered on its loop thread)."""

    run: RunState
    thresholds: Thresholds
    journal: JournalHealth
    journal_where: str
    journal_backlog_bytes: int
    state_disk: StateDisk | None
    # (attempt, rank, owner pid, claimant pid) of the refused claimants still alive
    live_claims: list[tuple[int, int, int, int]]
    # (attempt, rank, field, value, reason, whole frame dropped, count) of the values refused
    refused_fields: list[tuple[int, int, str, str, str, bool, int]]
    checkpoints: Callable[[float], list[Finding]]  # the checkpoint pipeline's own findings


def judge(guard: Guard, rules: Sequence[Rule[T]], seen: T, now: float) -> list[Finding]:
    """Every rule of a group through `guard`, findings in the group's order."""
    out: list[Finding] = []
    for rule in rules:
        out += guard.call(rule.name, _bound(rule, seen, now), [])
    return out


def _bound(rule: Rule[T], seen: T, now: float) -> Callable[[], list[Finding]]:
    return lambda: [f for f in rule.judge(seen, now) if f is not None]


def _ghost(w: Watched, now: float) -> Judged:
    return [ghost_finding(ghost_measure(w.run, w.ctx), w.memory.ghost_streak, w.run, w.ctx)]


def _state_disk(k: KeeperFacts, now: float) -> Judged:
    th = k.thresholds
    return [state_disk_low(k.state_disk, th.disk_warn, th.disk_critical) if k.state_disk else None]


# The run's state and the findings that come with it (DEAD, STALLED, HUNG, SLOW...) are judged
# first, by the watchdog's state rule ("watchdog.state", health/watchdog.py); these follow it.
WATCHDOG: tuple[Rule[Watched], ...] = (
    Rule(
        "watchdog.repeat_death",
        lambda w, now: [repeat_death(w.run, w.ctx.thresholds)] if w.run.attempt else [],
    ),
    Rule(
        "watchdog.masked_error",
        lambda w, now: [attempt_masked_error(w.run, w.ctx.log_crash)] if w.run.attempt else [],
    ),
    Rule("watchdog.rank_restarted", lambda w, now: [rank_restarted(w.run)]),
    Rule("watchdog.ghost", _ghost),
    Rule("watchdog.orphan", lambda w, now: orphan_findings(w.run, w.ctx, w.memory)),
    Rule("watchdog.gpu_events", lambda w, now: gpu_event_findings(w.ctx)),
    Rule("watchdog.gpu_ecc", lambda w, now: ecc_findings(w.ctx)),
    Rule("watchdog.gpu_throttle", lambda w, now: throttle_findings(w.ctx)),
    Rule("watchdog.gpu_link", lambda w, now: link_findings(w.ctx)),
    Rule("watchdog.host_ram", lambda w, now: [host_ram_low_now(w.run, w.ctx)]),
    Rule("watchdog.locks", lambda w, now: stale_locks(w.run, w.ctx)),
    Rule("watchdog.duplicates", lambda w, now: duplicate_findings(w.ctx)),
    Rule("watchdog.ckpt_incomplete", lambda w, now: [ckpt_incomplete(w.run)]),
)

SANITY: tuple[Rule[Detectors], ...] = (
    Rule("sanity.lr", lambda d, now: [d.lr.finding(d.facts, now)]),
    Rule("sanity.lr_runaway", lambda d, now: [d.runaway.finding(d.facts.th)]),
    Rule("sanity.exploded_start", lambda d, now: [d.first_loss.finding(d.facts, now)]),
    Rule("sanity.white_model", lambda d, now: [d.white.finding(d.facts, now)]),
    Rule("sanity.loss_spike", lambda d, now: [d.spike.finding(d.facts, now)]),
    Rule("sanity.divergence", lambda d, now: [d.divergence.finding(d.facts, now)]),
    Rule("sanity.grad", lambda d, now: [d.grad.finding(d.facts, now)]),
    Rule("sanity.nonfinite", lambda d, now: [d.nonfinite.finding(d.facts, now)]),
    Rule("sanity.loss_scale", lambda d, now: [d.scale.finding(d.facts, now)]),
    Rule("sanity.rank_outlier", lambda d, now: rank_outlier_findings(d.facts.ranks, d.facts.th)),
)

KEEPER: tuple[Rule[KeeperFacts], ...] = (
    Rule("checkpoints.findings", lambda k, now: k.checkpoints(now)),
    Rule(
        "keeper.journal",
        lambda k, now: [journal_write_failed(k.journal, k.journal_where, k.journal_backlog_bytes)],
    ),
    Rule("keeper.state_disk", _state_disk),
    Rule(
        "keeper.rank_claims",
        lambda k, now: rank_claimed(k.live_claims, k.run.attempt.n if k.run.attempt else None),
    ),
    Rule(
        "keeper.fields_refused",
        lambda k, now: fields_refused(k.refused_fields, k.run.attempt.n if k.run.attempt else None),
    ),
    Rule(
        "keeper.resume_from_scratch",
        lambda k, now: [resume_from_scratch(k.run.attempt)] if k.run.attempt else [],
    ),
)

# Every rule, for a listing (`trainroom doctor`, the docs): the part names a failpoint can break.
ALL: tuple[str, ...] = (
    "watchdog.state",
    *(r.name for r in WATCHDOG),
    *(r.name for r in SANITY),
    *(r.name for r in KEEPER),
)
