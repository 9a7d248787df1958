"""The parts of the run's state (`run.state.RunState`): an attempt, a rank, a rank's process, a
step row, a checkpoint, a cleared finding, the journal's damage. The fold's handlers
(`run.handlers`) build and update them; every reader reads them.
"""

from __future__ import annotations

import statistics

import msgspec

from trainroom.core.findings import Finding
from trainroom.core.samples import VramFloor
from trainroom.core.vocab import CkptState, RateSource
from trainroom.core.wire import protocol as p


class StepRow(msgspec.Struct, array_like=True):
    attempt: int
    rank: int
    step: int
    t: float
    loss: float | None
    tokens: int | None
    rate: float | None = None  # a log step's pace by the trainer's own timing, and from what
    rate_from: RateSource | None = None


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
