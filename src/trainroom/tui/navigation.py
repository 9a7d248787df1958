"""Moving through the control room: Tab between the panels (one the layout has no room for opens
zoomed), the zoom key, the log search, the loss plot's scale, and the runs overview. The control
room's base class above `ActionFlow`; the app hands it its panels and its run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Protocol

from textual import work
from textual.widget import Widget

from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from .action_flow import ActionFlow
from .link import OverviewReader
from .overview import RunRow, row_of
from .screens.runs import RunsScreen
from .screens.search import SearchPrompt
from .widgets.base import Panel
from .widgets.logtail import LogTailPanel
from .widgets.loss import LossPanel


class PanelSet(Protocol):
    @property
    def log(self) -> LogTailPanel: ...

    @property
    def loss(self) -> LossPanel: ...

    def in_order(self) -> list[Widget]: ...


def laid_out(widget: Widget) -> bool:
    """Whether the layout shows `widget` (neither it nor a container of it is hidden)."""
    node: Widget | None = widget
    while isinstance(node, Widget):
        if not node.display:
            return False
        parent = node.parent
        node = parent if isinstance(parent, Widget) else None
    return True


OVERVIEW_INTERVAL_S = 3.0  # the runs overview's refresh


class Navigation(ActionFlow):
    """Focus, zoom, search, plot scale and the runs: keys that move, never act on a run."""

    # The app's (see ControlRoom): the run followed, its state and the lock the reader folds under.
    run_info: RunInfo | None
    state: RunState | None
    connected: bool
    lock: threading.Lock
    overview: OverviewReader
    clock: Callable[[], float]

    def panels(self) -> PanelSet:
        raise NotImplementedError

    def switch_run(self, run_id: str) -> None:
        raise NotImplementedError

    def action_next_panel(self) -> None:
        self._move_focus(1)

    def action_previous_panel(self) -> None:
        self._move_focus(-1)

    def _move_focus(self, step: int) -> None:
        order = self.panels().in_order()
        focused = self.focused
        if focused in order:
            i = (order.index(focused) + step) % len(order)
        else:
            i = 0 if step > 0 else len(order) - 1
        self.show_panel(order[i])

    def show_panel(self, panel: Widget) -> None:
        """Focus `panel`; zoomed when the layout has no room for it (the ranks and the log at 24
        rows), else in its place."""
        screen = self.screen
        if not laid_out(panel):
            screen.maximize(panel, container=False)
        elif screen.maximized is not None:
            screen.minimize()
        panel.focus()

    def action_zoom(self) -> None:
        screen = self.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        focused = self.focused
        if not isinstance(focused, Panel):
            self.notify("zoom: focus a panel first (tab moves between them)", timeout=3)
            return
        screen.maximize(focused, container=False)

    def action_search(self) -> None:
        log = self.panels().log
        if not log.view:
            self.notify("search: the trainer log is empty so far", severity="warning", timeout=3)
            return
        self.push_screen(SearchPrompt(log.pattern), self._search_for)

    def _search_for(self, pattern: str | None) -> None:
        if not pattern:
            return
        log = self.panels().log
        self.show_panel(log)
        if not log.search(pattern):
            self.notify(
                f"search: no line of the last {len(log.view or ())} holds {pattern!r}",
                timeout=4,
                markup=False,
            )

    def action_log_scale(self) -> None:
        loss = self.panels().loss
        loss.log_y = not loss.log_y
        self.notify("loss plot: log scale" if loss.log_y else "loss plot: linear scale", timeout=2)

    def action_recent_window(self) -> None:
        loss = self.panels().loss
        loss.recent = not loss.recent
        self.notify(
            "loss plot: the recent fifth of the run, fitted" if loss.recent else "loss plot: the whole run",
            timeout=2,
        )

    # ------------------------------------------------------------------ the runs overview

    def action_runs(self) -> None:
        screen = RunsScreen([], self.clock(), self.run_info.run_id if self.run_info else None)
        self.push_screen(screen, self._overview_closed)
        self._refresh_overview(screen)

    @work(thread=True, exclusive=True, group="overview", exit_on_error=False)
    def _refresh_overview(self, screen: RunsScreen) -> None:
        current = None
        with self.lock:  # only the followed run's row: the reader folds into its state
            if self.run_info is not None and self.state is not None:
                current = row_of(self.run_info, self.state, self.connected)
        rows = self.overview.rows(current)
        self.call_from_thread(self._overview_rows, screen, rows)

    def _overview_rows(self, screen: RunsScreen, rows: list[RunRow]) -> None:
        if screen.is_attached:
            screen.update_rows(rows, self.clock())
            self.set_timer(OVERVIEW_INTERVAL_S, partial(self._refresh_overview, screen))

    def _overview_closed(self, run_id: str | None) -> None:
        if run_id is not None:
            self.switch_run(run_id)
