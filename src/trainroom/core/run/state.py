"""The run as every client sees it: a fold over the keeper's records.

The keeper applies each record here as it journals it, a client applies the same records as live
deltas on top of the snapshot it got on connect, and `status` of a run whose keeper is gone
replays the journal. One fold, three readers: nothing a client shows can disagree with the journal.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.config import Thresholds
from trainroom.core.findings import Finding, order
from trainroom.core.run.requested import merge_requested
from trainroom.core.samples import VramFloor
from trainroom.core.settings import LaunchOptions
from trainroom.core.vocab import CkptState, StateName

RECENT_STEPS = 512  # raw steps kept in memory and in the snapshot (the journal has them all)
INTERVALS = 64  # step intervals kept per rank for the cadence statistics
NOTES = 200
ACTIONS = 50
NOTIFICATIONS = 50
RESOLVED = 50  # cleared findings kept, newest last: the control room's history


class StepRow(msgspec.Struct, array_like=True):
    attempt: int
    rank: int
    step: int
    t: float
    loss: float | None
    tokens: int | None
    rate: float | None = None  # a log step's pace by the trainer's own timing, and from what
    rate_from: str | None = None


class AttemptView(msgspec.Struct, kw_only=True):
    n: int
    pid: int
    pgid: int
    start_time: float
    started_at: float
    start_ticks: int | None = None
    argv: list[str]
    cwd: str
    resume_from: str | None = None
    resume_step: int | None = None
    requested: p.RequestedConfig = msgspec.field(default_factory=p.RequestedConfig)
    instrumented: bool = False  # a reporter said Hello
    ended_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    error: str | None = None
    first_step: int | None = None
    last_step: int | None = None
    last_step_t: float | None = None
    crash: p.Crash | None = None
    bye: str | None = None
    stop_by: str | None = None  # a user's kill is under way (AttemptStopping): who asked
    stop_until: float | None = None
    vram_floor: VramFloor | None = None  # the devices' memory before the trainer started
    attached: bool = False  # adopted by `trainroom attach`: no exit status, and not its env's run

    @property
    def alive(self) -> bool:
        return self.ended_at is None

    @property
    def stopped(self) -> bool:
        """Ended by a user's kill (within its deadline): "stopped", not a death."""
        return self.ended_at is not None and self.stop_until is not None and self.ended_at <= self.stop_until


class RankView(msgspec.Struct, kw_only=True):
    rank: int
    attempt: int
    pid: int | None = None
    world_size: int = 1
    connected: bool = False
    step: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    lr: list[float] = []
    loss_scale: float | None = None
    tokens: int | None = None
    first_step_t: float | None = None
    last_step_t: float | None = None
    intervals: list[float] = []
    tokens_per_s: float | None = None
    last_heartbeat_t: float | None = None
    phase: str = "train"
    phase_since: float | None = None
    phase_bound_s: float | None = None
    main_frame: str | None = None
    main_frame_age_s: float | None = None
    alloc_allocated: int | None = None
    alloc_reserved: int | None = None
    alloc_peak: int | None = None
    dropped: int = 0
    steps_seen: int = 0
    # When its reporter's connection closed (TrainerDisconnected): a job's first failure is the
    # earliest of these across its nodes.
    disconnected_at: float | None = None

    @property
    def median_interval(self) -> float | None:
        return statistics.median(self.intervals) if self.intervals else None


class WorkerView(msgspec.Struct, kw_only=True):
    """A rank's process of the current attempt (probes.workers): its pid and how it ended."""

    pid: int
    rank: int
    attempt: int
    start_ticks: int
    seen_at: float
    local_rank: int | None = None
    world_size: int | None = None
    pgid: int = 0
    sid: int = 0
    restarts_left: int | None = None  # torch elastic's restart budget (p.WorkerSeen)
    ended_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    end_source: str | None = None  # p.WorkerEnded.source
    root_cause: bool = False

    @property
    def alive(self) -> bool:
        return self.ended_at is None

    @property
    def failed(self) -> bool:
        """It ended by a signal or a non-zero exit (an end of unknown kind is not called one)."""
        return self.ended_at is not None and (self.exit_signal is not None or self.exit_code not in (None, 0))


class CheckpointView(msgspec.Struct, kw_only=True):
    path: str
    step: int | None
    state: CkptState
    t: float
    reason: str | None = None
    size_bytes: int | None = None
    digest: str | None = None
    report: p.CheckpointReport | None = None
    eval: p.EvalFigure | None = None


class ResolvedFinding(msgspec.Struct, kw_only=True):
    """A finding that was open and cleared: what it said, and when it cleared."""

    finding: Finding
    cleared_at: float


class JournalDamage(msgspec.Struct, kw_only=True):
    regions: int = 0
    skipped_bytes: int = 0
    unknown_records: int = 0
    torn_tail: bool = False
    first_offset: int | None = None


BATCH_LOGS = 16


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

    def _attempt_started(self, r: p.AttemptStarted) -> None:
        self.attempts.append(
            AttemptView(
                n=r.n,
                pid=r.pid,
                pgid=r.pgid,
                start_time=r.start_time,
                start_ticks=r.start_ticks,
                started_at=r.t,
                argv=r.argv,
                cwd=r.cwd,
                resume_from=r.resume_from,
                resume_step=r.resume_step,
                requested=r.requested,
                vram_floor=r.vram_floor,
                attached=r.attached,
            )
        )
        self.ranks = {}
        self.workers = {}

    def _attempt_ended(self, r: p.AttemptEnded) -> None:
        a = self._attempt_n(r.n)
        if a is None:
            return
        a.ended_at, a.exit_code, a.exit_signal, a.error = r.t, r.exit_code, r.exit_signal, r.error
        for rank in self.ranks.values():
            rank.connected = False

    def _attempt_stopping(self, r: p.AttemptStopping) -> None:
        a = self._attempt_n(r.n)
        if a is not None and a.ended_at is None:
            a.stop_by, a.stop_until = r.by, r.until

    def _attempt_n(self, n: int) -> AttemptView | None:
        for a in reversed(self.attempts):
            if a.n == n:
                return a
        return None

    def _received(self, r: p.Received) -> None:
        a = self._attempt_n(r.attempt)
        if a is None:
            return
        msg = r.msg
        rank = self.ranks.get(r.rank)
        if rank is None or rank.attempt != r.attempt:
            rank = self.ranks[r.rank] = RankView(rank=r.rank, attempt=r.attempt)
        if isinstance(msg, p.Step):
            self._step(a, rank, r, msg)
        elif isinstance(msg, p.Heartbeat):
            rank.last_heartbeat_t = r.t
            rank.main_frame, rank.main_frame_age_s = msg.main_frame, msg.main_frame_age_s
            rank.dropped = msg.dropped
            if msg.phase != rank.phase:
                rank.phase, rank.phase_since, rank.phase_bound_s = msg.phase, r.t, None
        elif isinstance(msg, p.Hello):
            a.instrumented = True
            rank.pid, rank.world_size, rank.connected = msg.pid, msg.world_size, True
            rank.disconnected_at = None
            rank.last_heartbeat_t = r.t
            if r.rank == 0 or a.requested == p.RequestedConfig():
                a.requested = merge_requested(a.requested, msg.config)
        elif isinstance(msg, p.Phase):
            rank.phase, rank.phase_since, rank.phase_bound_s = msg.name, r.t, msg.bound_s
            rank.last_heartbeat_t = r.t
        elif isinstance(msg, p.Checkpoint):
            self._checkpoint(
                p.CheckpointState(
                    path=msg.path,
                    step=msg.step,
                    state="candidate",
                    t=r.t,
                    size_bytes=msg.size_bytes,
                    digest=msg.digest,
                )
            )
        elif isinstance(msg, p.Crash):
            a.crash = msg
        elif isinstance(msg, p.Note):
            self._note(
                {
                    "t": r.t,
                    "kind": msg.kind,
                    "message": msg.message,
                    "step": msg.step,
                    "rank": r.rank,
                    "attempt": r.attempt,
                    "data": msg.data,
                }
            )
        elif isinstance(msg, p.Bye):
            a.bye = msg.reason
            rank.connected = False

    def _step(self, a: AttemptView, rank: RankView, r: p.Received, s: p.Step) -> None:
        if rank.last_step_t is not None and s.step > (rank.step if rank.step is not None else -1):
            rank.intervals.append(max(r.t - rank.last_step_t, 0.0))
            if len(rank.intervals) > INTERVALS:
                del rank.intervals[0]
        if rank.first_step_t is None:
            rank.first_step_t = r.t
        if s.tokens is not None and rank.tokens is not None and rank.last_step_t is not None:
            dt = r.t - rank.last_step_t
            if dt > 0 and s.tokens >= rank.tokens:
                rate = (s.tokens - rank.tokens) / dt
                rank.tokens_per_s = (
                    rate if rank.tokens_per_s is None else 0.8 * rank.tokens_per_s + 0.2 * rate
                )
        rank.step, rank.last_step_t = s.step, r.t
        # A step without a loss (an HF Trainer step between two logs, a progress bar's step) keeps
        # the last loss shown, as the sanity rules do.
        rank.loss = s.loss if s.loss is not None else rank.loss
        rank.grad_norm = s.grad_norm if s.grad_norm is not None else rank.grad_norm
        rank.steps_seen += 1
        if s.lr:
            rank.lr = s.lr
        if s.tokens is not None:
            rank.tokens = s.tokens
        if s.loss_scale is not None:
            rank.loss_scale = s.loss_scale
        if s.alloc_allocated is not None:
            rank.alloc_allocated, rank.alloc_reserved, rank.alloc_peak = (
                s.alloc_allocated,
                s.alloc_reserved,
                s.alloc_peak,
            )
        if rank.phase != "train" and s.source == "reporter":
            rank.phase, rank.phase_since, rank.phase_bound_s = "train", r.t, None
        if s.source == "log":
            rank.last_heartbeat_t = r.t
        if a.first_step is None:
            a.first_step = s.step
        a.last_step = s.step if a.last_step is None else max(a.last_step, s.step)
        a.last_step_t = r.t
        self.steps_total += 1
        self.recent_steps.append(
            StepRow(r.attempt, r.rank, s.step, r.t, s.loss, s.tokens, s.rate, s.rate_from)
        )
        if len(self.recent_steps) > 2 * RECENT_STEPS:
            del self.recent_steps[:-RECENT_STEPS]

    def _checkpoint(self, r: p.CheckpointState) -> None:
        c = self.checkpoint(r.path)
        if c is None:
            self.checkpoints.append(
                CheckpointView(
                    path=r.path,
                    step=r.step,
                    state=r.state,
                    t=r.t,
                    reason=r.reason,
                    size_bytes=r.size_bytes,
                    digest=r.digest,
                    report=r.report,
                    eval=r.eval,
                )
            )
            return
        if r.state != "candidate" and c.state == "candidate" and _older(r.step, c.step):
            # A verdict on an older version of a path saved over since (Lightning's last.ckpt,
            # nanoGPT's ckpt.pt): the newer one is still to be verified (the pipeline runs again).
            return
        c.state, c.t = r.state, r.t
        c.reason = r.reason
        if r.step is not None:
            c.step = r.step
        if r.size_bytes is not None:
            c.size_bytes = r.size_bytes
        if r.digest is not None:
            c.digest = r.digest
        if r.report is not None:
            c.report = r.report
        if r.eval is not None:
            c.eval = r.eval

    def _worker_seen(self, r: p.WorkerSeen) -> None:
        a = self.attempt
        if a is None or a.n != r.attempt:
            return
        self.workers[r.pid] = WorkerView(
            pid=r.pid,
            rank=r.rank,
            attempt=r.attempt,
            start_ticks=r.start_ticks,
            seen_at=r.t,
            local_rank=r.local_rank,
            world_size=r.world_size,
            pgid=r.pgid,
            sid=r.sid,
            restarts_left=r.restarts_left,
        )

    def _worker_ended(self, r: p.WorkerEnded) -> None:
        w = self.workers.get(r.pid)
        if w is None or w.attempt != r.attempt:
            return
        if w.ended_at is None:
            w.ended_at = r.t
        told = r.exit_code is not None or r.exit_signal is not None
        # What the kernel said (the wait status) stands; torchrun's report fills in an unknown.
        if w.end_source is None or (told and w.end_source == "gone"):
            w.exit_code, w.exit_signal, w.end_source = r.exit_code, r.exit_signal, r.source
        w.root_cause = w.root_cause or r.root_cause

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

    def _finding(self, r: p.FindingRaised) -> None:
        self.findings[r.finding.ident] = r.finding

    def _finding_cleared(self, r: p.FindingCleared) -> None:
        f = self.findings.pop(r.ident, None)
        if f is not None:
            self.resolved.append(ResolvedFinding(finding=f, cleared_at=r.t))
            del self.resolved[:-RESOLVED]

    def _action(self, r: p.ActionRecord) -> None:
        self.actions.append(r)
        del self.actions[:-ACTIONS]

    def _trainer_disconnected(self, r: p.TrainerDisconnected) -> None:
        rank = self.ranks.get(r.rank)
        if rank is not None and rank.attempt == r.attempt:
            rank.connected = False
            rank.disconnected_at = r.t

    def _conn_closed(self, r: p.ConnectionClosed) -> None:
        self.closed_connections += 1
        self._note({"t": r.t, "kind": "connection-closed", "message": r.reason})

    def _probe(self, r: p.ProbeSample) -> None:
        self.probe = r

    def _status(self, r: p.RunStatus) -> None:
        self.status, self.status_reason, self.status_since = r.state, r.reason, r.t

    def _keeper_started(self, r: p.KeeperStarted) -> None:
        self.thresholds, self.keeper_pid = r.thresholds, r.pid
        self.resume_template, self.resume_template_from = r.resume_template, r.resume_template_from

    def _log_recognised(self, r: p.LogRecognised) -> None:
        if r.name == "none":
            self.log_unread_lines = r.lines
            return
        self.log_recogniser, self.log_unit, self.log_unread_lines = r.name, r.unit or None, None

    def _journal_damaged(self, r: p.JournalDamaged) -> None:
        d = self.journal_damage
        if r.skipped_bytes:
            d.regions += 1
            d.skipped_bytes += r.skipped_bytes
            d.first_offset = r.offset if d.first_offset is None else d.first_offset
        d.unknown_records += r.unknown_records
        d.torn_tail = d.torn_tail or r.torn_tail

    def _keeper_note(self, r: p.KeeperNote) -> None:
        self._note({"t": r.t, "kind": r.kind, "message": r.message})

    def _notify(self, r: p.NotifyResult) -> None:
        self.notifications.append(r)
        del self.notifications[:-NOTIFICATIONS]
        self.notify_outcomes[r.outcome] = self.notify_outcomes.get(r.outcome, 0) + 1

    def _note(self, note: dict[str, Any]) -> None:
        self.notes.append(note)
        del self.notes[:-NOTES]

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


def _older(step: int | None, than: int | None) -> bool:
    return step is not None and than is not None and step < than


def _batch_log(st: RunState, r: p.BatchLog) -> None:
    st.batch_logs.append(r)
    del st.batch_logs[:-BATCH_LOGS]


_HANDLERS: dict[type, Callable[[RunState, Any], None]] = {
    p.BatchLog: _batch_log,
    p.AttemptStarted: RunState._attempt_started,
    p.AttemptEnded: RunState._attempt_ended,
    p.AttemptStopping: RunState._attempt_stopping,
    p.Received: RunState._received,
    p.CheckpointState: RunState._checkpoint,
    p.FindingRaised: RunState._finding,
    p.FindingCleared: RunState._finding_cleared,
    p.ActionRecord: RunState._action,
    p.ConnectionClosed: RunState._conn_closed,
    p.TrainerDisconnected: RunState._trainer_disconnected,
    p.ProbeSample: RunState._probe,
    p.RunStatus: RunState._status,
    p.KeeperStarted: RunState._keeper_started,
    p.KeeperNote: RunState._keeper_note,
    p.JournalDamaged: RunState._journal_damaged,
    p.NotifyResult: RunState._notify,
    p.WorkerSeen: RunState._worker_seen,
    p.WorkerEnded: RunState._worker_ended,
    p.LogRecognised: RunState._log_recognised,
}


def to_snapshot(state: RunState) -> Any:
    return msgspec.to_builtins(state)


def from_snapshot(obj: Any) -> RunState:
    return msgspec.convert(obj, RunState)
