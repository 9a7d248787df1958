"""The control room's refresh: the panels drawn from the state (urgent changes within app.
URGENT_INTERVAL_S, routine telemetry at most every app.ROUTINE_INTERVAL_S, ages once a second)."""

from __future__ import annotations

import time

from trainroom.core.run.state import RunState

from . import figures, verdict
from .bindings import KEEPER_ACTIONS
from .keys import RoomKeys
from .verdict import FindingsView
from .widgets.banner import BannerView
from .widgets.keystrip import key_strip_view


class Refreshing(RoomKeys):
    """Drawing the panels from the run's state when it changed."""

    # ------------------------------------------------------------------ rendering

    def _tick(self) -> None:
        self._dirty = True

    def _render_if_dirty(self) -> None:
        if not self.is_running:
            return
        # What a kill key acts on follows the focus and the findings' cursor: the key strip and
        # the findings' keys are redrawn as soon as either moves.
        aim = (self.focused, self.panels().findings.selected)
        if aim != self._aim:
            self._aim, self._urgent = aim, True
        if self._urgent or (self._dirty and time.monotonic() - self._drawn_at >= self.routine_interval_s):
            self.redraw()

    def redraw(self) -> None:
        """Render the panels from the state now (the timers call it; so do tests). Each panel
        gets a frozen view and repaints only when it differs from the one it shows."""
        self._dirty = self._urgent = False
        now = self.clock()
        state = self.state
        if state is None or not self.is_running:
            return  # (a timer may still fire while the app shuts down and its widgets go)
        self._drawn_at = time.monotonic()  # not `clock`: tests freeze that one
        p = self.panels()
        self.renders += 1
        where = self.situation()
        key = self.key_text
        # Views are computed under the lock (the reader folds records under it), set after it.
        with self.lock:
            header = verdict.header_view(state, now, self.connected, self.keeper_busy, self.gone)
            trainer = figures.trainer_view(state, now)
            vram = figures.vram_view(state)
            cadence = figures.cadence_view(state, now)
            lr = figures.lr_view(state)
            host = figures.host_view(state)
            disk = figures.disk_view(state)
            rows = verdict.findings_view(state, key, where, now)
            resolved = verdict.resolved_view(state)
            snapshot = self.series.snapshot() if self.series is not None else None
            loss, ranks = figures.loss_view(state, snapshot), figures.ranks_view(state)
            banner = self._banner_view(state, now)
            refusals = {a: verdict.refusal(state, a, where) for a in KEEPER_ACTIONS}
        self.findings_now = FindingsView(
            open=verdict.kill_keys(rows, self._target_of(rows)), resolved=resolved
        )
        p.header.view, p.trainer.view, p.vram.view, p.cadence.view = header, trainer, vram, cadence
        p.lr.view, p.host.view, p.disk.view, p.findings.view = lr, host, disk, self.findings_now
        p.loss.view, p.ranks.view = loss, ranks
        p.log.view = self.log_lines or None
        p.banner.view = banner
        p.keys.view = key_strip_view(
            self.findings_now.open, refusals, self.key_text, first=self.flow.strip_keys()
        )

    def _banner_view(self, state: RunState, now: float) -> BannerView | None:
        if self.connected or self.gone_since is None:
            return None
        a = state.attempt
        return BannerView(
            since=self.gone_since,
            reason=self.gone_reason,
            state=state.status,
            state_reason=state.status_reason,
            last_step=a.last_step if a else None,
            now=now,
            resume_key=self.key_text("resume"),
            busy=self.keeper_busy,
            way_on=self.why_not("resume") or "",
        )
