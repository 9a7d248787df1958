"""The fold of what each rank's reporter says (Received: its steps, heartbeats, phases, hello,
checkpoints, crash, notes, bye; TrainerDisconnected) and of its processes (WorkerSeen, WorkerEnded)."""

from __future__ import annotations

from typing import Protocol

from trainroom.core.run.handlers import attempts, checkpoints, keeper
from trainroom.core.run.handlers.attempts import _attempt_n
from trainroom.core.run.handlers.checkpoints import _checkpoint
from trainroom.core.run.handlers.keeper import _note
from trainroom.core.run.parts import AttemptView, RankView, StepRow, WorkerView
from trainroom.core.run.requested import merge_requested
from trainroom.core.wire import protocol as p

RECENT_STEPS = 512  # raw steps kept in memory and in the snapshot (the journal has them all)
INTERVALS = 64  # step intervals kept per rank for the cadence statistics


class Run(attempts.Run, checkpoints.Run, keeper.Notes, Protocol):
    """What the rank and worker handlers read and write of the run's state."""

    recent_steps: list[StepRow]
    steps_total: int

    @property
    def attempt(self) -> AttemptView | None: ...


def _received(st: Run, r: p.Received) -> None:
    a = _attempt_n(st, r.attempt)
    if a is None:
        return
    msg = r.msg
    rank = st.ranks.get(r.rank)
    if rank is None or rank.attempt != r.attempt:
        rank = st.ranks[r.rank] = RankView(rank=r.rank, attempt=r.attempt)
    if isinstance(msg, p.Step):
        _step(st, a, rank, r, msg)
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
        _checkpoint(
            st,
            p.CheckpointState(
                path=msg.path,
                step=msg.step,
                state="candidate",
                t=r.t,
                size_bytes=msg.size_bytes,
                digest=msg.digest,
            ),
        )
    elif isinstance(msg, p.Crash):
        a.crash = msg
    elif isinstance(msg, p.Note):
        _note(
            st,
            {
                "t": r.t,
                "kind": msg.kind,
                "message": msg.message,
                "step": msg.step,
                "rank": r.rank,
                "attempt": r.attempt,
                "data": msg.data,
            },
        )
    elif isinstance(msg, p.Bye):
        a.bye = msg.reason
        rank.connected = False


def _step(st: Run, a: AttemptView, rank: RankView, r: p.Received, s: p.Step) -> None:
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
            rank.tokens_per_s = rate if rank.tokens_per_s is None else 0.8 * rank.tokens_per_s + 0.2 * rate
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
    st.steps_total += 1
    st.recent_steps.append(StepRow(r.attempt, r.rank, s.step, r.t, s.loss, s.tokens, s.rate, s.rate_from))
    if len(st.recent_steps) > 2 * RECENT_STEPS:
        del st.recent_steps[:-RECENT_STEPS]


def _worker_seen(st: Run, r: p.WorkerSeen) -> None:
    a = st.attempt
    if a is None or a.n != r.attempt:
        return
    st.workers[r.pid] = WorkerView(
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


def _worker_ended(st: Run, r: p.WorkerEnded) -> None:
    w = st.workers.get(r.pid)
    if w is None or w.attempt != r.attempt:
        return
    if w.ended_at is None:
        w.ended_at = r.t
    told = r.exit_code is not None or r.exit_signal is not None
    # What the kernel said (the wait status) stands; torchrun's report fills in an unknown.
    if w.end_source is None or (told and w.end_source == "gone"):
        w.exit_code, w.exit_signal, w.end_source = r.exit_code, r.exit_signal, r.source
    w.root_cause = w.root_cause or r.root_cause


def _trainer_disconnected(st: Run, r: p.TrainerDisconnected) -> None:
    rank = st.ranks.get(r.rank)
    if rank is not None and rank.attempt == r.attempt:
        rank.connected = False
        rank.disconnected_at = r.t
