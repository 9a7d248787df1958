"""The fold of an attempt's start, stop and end (AttemptStarted, AttemptStopping, AttemptEnded)."""

from __future__ import annotations

from typing import Protocol

from trainroom.core.run.parts import AttemptView, RankView, WorkerView
from trainroom.core.wire import protocol as p


class Run(Protocol):
    """What the attempt handlers read and write of the run's state."""

    attempts: list[AttemptView]
    ranks: dict[int, RankView]
    workers: dict[int, WorkerView]


def _attempt_started(st: Run, r: p.AttemptStarted) -> None:
    st.attempts.append(
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
    st.ranks = {}
    st.workers = {}


def _attempt_ended(st: Run, r: p.AttemptEnded) -> None:
    a = _attempt_n(st, r.n)
    if a is None:
        return
    a.ended_at, a.exit_code, a.exit_signal, a.error = r.t, r.exit_code, r.exit_signal, r.error
    for rank in st.ranks.values():
        rank.connected = False


def _attempt_stopping(st: Run, r: p.AttemptStopping) -> None:
    a = _attempt_n(st, r.n)
    if a is not None and a.ended_at is None:
        a.stop_by, a.stop_until = r.by, r.until


def _attempt_n(st: Run, n: int) -> AttemptView | None:
    for a in reversed(st.attempts):
        if a.n == n:
            return a
    return None
