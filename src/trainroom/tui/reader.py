"""The keeper reader: a plain thread that folds live deltas into the run's state.

No Textual here, so it can be tested without an app: the thread owns the link's blocking socket,
applies each batch of records under the lock the app renders under (to the run's state and to
its plot series), and tells the app through callbacks, which post small messages. A burst of
batches costs one render: the app's message for a change replaces the one still queued.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p

from .link import KeeperLink


def series_for(view: RunView) -> Series:
    """The plot series to fold live records into: the view's (the whole run, as the keeper or
    the journal replay folded it) when it holds anything, else seeded from the recent raw steps
    (a snapshot from a keeper that sends no series) so the curve does not start empty."""
    if view.series.total_points or view.series.marks:
        return view.series
    state = view.state
    series = Series()
    series.vitals = view.series.vitals  # the history graphs' samples, whatever the curve's
    a = state.attempt
    if a is not None:
        series.set_loss_baseline(a.requested.vocab_size)
    tokens_at: dict[tuple[int, int], int | None] = {}
    attempt: int | None = None
    for row in state.recent_steps:
        if row.rank != 0:
            continue
        if attempt is not None and row.attempt != attempt:
            series.mark("restart", label=f"attempt {row.attempt}")
        attempt = row.attempt
        series.observe_step(row.step, t=row.t, tokens=row.tokens, loss=row.loss)
        tokens_at[(row.attempt, row.step)] = row.tokens
    steps = {step: tok for (_, step), tok in tokens_at.items()}
    for c in state.checkpoints:
        if c.state == "verified" and c.step in steps:
            tok = steps[c.step]
            x = float(tok if series.x_unit == "tokens" and tok is not None else c.step)
            series.mark("checkpoint", label=c.path.rstrip("/").rsplit("/", 1)[-1], step=c.step, x=x)
    return series


def routine(rec: object) -> bool:
    """Telemetry that flows all the time: a step, a heartbeat, a probe sample."""
    if isinstance(rec, p.Received):
        return isinstance(rec.msg, (p.Step, p.Heartbeat))
    return isinstance(rec, (p.ProbeSample, p.Vitals))


class KeeperReader(threading.Thread):
    def __init__(
        self,
        link: KeeperLink,
        lock: threading.Lock,
        *,
        on_snapshot: Callable[[RunState, Series], object],
        on_change: Callable[[bool], object],
        on_gone: Callable[[str, float], object],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="trainroom-keeper-reader", daemon=True)
        self.link = link
        self.lock = lock
        self._on_snapshot = on_snapshot
        self._on_change = on_change
        self._on_gone = on_gone
        self._clock = clock
        self._stopping = threading.Event()
        self.batches = 0
        self.records = 0

    def run(self) -> None:
        reason = "the keeper closed the connection"
        try:
            view = self.link.subscribe_view(client="tui")
            state, series = view.state, series_for(view)
            self._on_snapshot(state, series)
            for batch in self.link.records():
                if self._stopping.is_set():
                    return
                urgent = False
                with self.lock:
                    for rec in batch:
                        state.apply(rec)
                        series.observe_record(rec)
                        urgent = urgent or not routine(rec)
                self.batches += 1
                self.records += len(batch)
                self._on_change(urgent)
        except Exception as exc:  # KeeperGone, a reset socket, a bad frame: all mean "gone"
            reason = str(exc) or type(exc).__name__
        if not self._stopping.is_set():
            self._on_gone(reason, self._clock())

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        try:
            self.link.close()  # the client shuts its socket down first: a blocked recv() wakes
        except Exception:  # closing a dead socket must never take the app down
            pass
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
