"""The run as every client sees it: a fold over the keeper's records.

The keeper applies each record here as it journals it, a client applies the same records as live
deltas on top of the snapshot it got on connect, and `status` of a run whose keeper is gone
replays the journal. One fold, three readers: nothing a client shows can disagree with the journal.

The state's parts (an attempt, a rank, a checkpoint...) are in `run.parts`; how each record changes
them, by subject, in `run.handlers`; `apply` finds a record's handler in the table below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.findings import Finding, order
from trainroom.core.run.handlers import attempts as on_attempts
from trainroom.core.run.handlers import checkpoints as on_checkpoints
from trainroom.core.run.handlers import findings as on_findings
from trainroom.core.run.handlers import keeper as on_keeper
from trainroom.core.run.handlers import ranks as on_ranks
from trainroom.core.run.parts import (
    AttemptView,
    CheckpointView,
    JournalDamage,
    RankView,
    ResolvedFinding,
    StepRow,
    WorkerView,
)
from trainroom.core.vocab import StateName
from trainroom.core.wire import protocol as p


class RunState(msgspec.Struct, kw_only=True):
    run_id: str
    argv: list[str]
    cwd: str
    created: float
    options: LaunchOptions = msgspec.field(default_factory=LaunchOptions)
    status: StateName = "starting"
    status_reason: str = ""
    status_since: float = 0.0
    attempts: list[AttemptView] = []
    ranks: dict[int, RankView] = {}
    # The current attempt's rank processes by pid (torchrun workers), live or ended.
    workers: dict[int, WorkerView] = {}
    recent_steps: list[StepRow] = []
    checkpoints: list[CheckpointView] = []
    findings: dict[str, Finding] = {}
    # Findings that cleared (a resume clears DEAD): the history a reader shows, bounded.
    resolved: list[ResolvedFinding] = []
    probe: p.ProbeSample | None = None
    actions: list[p.ActionRecord] = []
    notes: list[dict[str, Any]] = []
    closed_connections: int = 0
    steps_total: int = 0
    # The thresholds the keeper's rules use (KeeperStarted): what a reader computes bounds with.
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)
    keeper_pid: int | None = None
    # What a journal reader had to skip (JournalDamaged): shown, never silently dropped.
    journal_damage: JournalDamage = msgspec.field(default_factory=lambda: JournalDamage())
    # The last alert deliveries (core/notify), newest last, and how many of each outcome so far.
    notifications: list[p.NotifyResult] = []
    notify_outcomes: dict[str, int] = {}
    # Which log recogniser read an uninstrumented attempt's steps (LogRecognised), and the resume
    # template with where it came from (KeeperStarted).
    log_recogniser: str | None = None
    log_unit: str | None = None  # what its steps count (logformats: optimizer steps, batches, ...)
    log_unread_lines: int | None = None  # the log was read, nothing recognised in these lines
    resume_template: str | None = None
    resume_template_from: str | None = None
    # The batches around each loss spike, divergence or non-finite value (BatchLog), the newest
    # BATCH_LOGS: what `trainroom replay` replays.
    batch_logs: list[p.BatchLog] = []

    # ------------------------------------------------------------------ views

    @property
    def attempt(self) -> AttemptView | None:
        return self.attempts[-1] if self.attempts else None

    def open_findings(self) -> list[Finding]:
        return order(list(self.findings.values()))

    def checkpoint(self, path: str) -> CheckpointView | None:
        for c in self.checkpoints:
            if c.path == path:
                return c
        return None

    def last_verified(self) -> CheckpointView | None:
        verified = [c for c in self.checkpoints if c.state == "verified"]
        return max(verified, key=lambda c: (c.step or -1, c.t)) if verified else None

    # ------------------------------------------------------------------ the fold

    def apply(self, rec: p.Record) -> None:
        handler = _HANDLERS.get(type(rec))
        if handler is not None:
            handler(self, rec)

    # ------------------------------------------------------------------ the ranks' processes

    def attempt_workers(self) -> list[tuple[int, int]]:
        """(pid, start tick) of the current attempt's rank processes not known to have ended:
        what a kill must reach beside the attempt's group."""
        a = self.attempt
        return sorted(
            (w.pid, w.start_ticks)
            for w in self.workers.values()
            if a is not None and w.attempt == a.n and w.alive and w.start_ticks > 0
        )

    def hung_worker(self) -> int | None:
        """The live worker an open HUNG finding names (its pid), if any: what a stack dump is for."""
        a = self.attempt
        for f in self.findings.values():
            pid = f.evidence.get("pid") if f.code == "HUNG" else None
            w = self.workers.get(pid) if isinstance(pid, int) else None
            if a is not None and w is not None and w.alive and w.attempt == a.n:
                return w.pid
        return None

    def worker_death(self, a: AttemptView) -> WorkerView | None:
        """The rank process whose end took the attempt down: the one torchrun names its root
        cause, else the first to fail before the leader ended. None when no worker failed first.
        The leader's own end is the attempt's (Lightning's rank 0), not a worker's death."""
        ranks = [w for w in self.workers.values() if w.attempt == a.n and w.pid != a.pid]
        # A group torch elastic restarted is over: only the latest group's deaths end the attempt.
        latest = min((w.restarts_left for w in ranks if w.restarts_left is not None), default=None)
        failed = [w for w in ranks if w.failed and (latest is None or w.restarts_left in (None, latest))]
        if a.ended_at is not None:
            failed = [w for w in failed if w.root_cause or (w.ended_at or 0.0) <= a.ended_at]
        if not failed:
            return None
        return min(failed, key=lambda w: (not w.root_cause, w.ended_at or 0.0, w.rank))

    # ------------------------------------------------------------------ headline figures

    def step_interval(self) -> float | None:
        """The median step interval of the slowest rank (the one that paces the run)."""
        meds = [m for r in self.ranks.values() if (m := r.median_interval) is not None]
        return max(meds) if meds else None

    def last_step_t(self) -> float | None:
        ts = [r.last_step_t for r in self.ranks.values() if r.last_step_t is not None]
        return max(ts) if ts else None

    def current_step(self) -> int | None:
        steps = [r.step for r in self.ranks.values() if r.step is not None]
        return min(steps) if steps else None


_HANDLERS: dict[type, Callable[[RunState, Any], None]] = {
    p.BatchLog: on_findings._batch_log,
    p.AttemptStarted: on_attempts._attempt_started,
    p.AttemptEnded: on_attempts._attempt_ended,
    p.AttemptStopping: on_attempts._attempt_stopping,
    p.Received: on_ranks._received,
    p.CheckpointState: on_checkpoints._checkpoint,
    p.FindingRaised: on_findings._finding,
    p.FindingCleared: on_findings._finding_cleared,
    p.ActionRecord: on_findings._action,
    p.ConnectionClosed: on_keeper._conn_closed,
    p.TrainerDisconnected: on_ranks._trainer_disconnected,
    p.ProbeSample: on_keeper._probe,
    p.RunStatus: on_keeper._status,
    p.KeeperStarted: on_keeper._keeper_started,
    p.KeeperNote: on_keeper._keeper_note,
    p.JournalDamaged: on_keeper._journal_damaged,
    p.NotifyResult: on_findings._notify,
    p.WorkerSeen: on_ranks._worker_seen,
    p.WorkerEnded: on_ranks._worker_ended,
    p.LogRecognised: on_keeper._log_recognised,
}


def to_snapshot(state: RunState) -> Any:
    return msgspec.to_builtins(state)


def from_snapshot(obj: Any) -> RunState:
    return msgspec.convert(obj, RunState)
