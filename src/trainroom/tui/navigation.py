"""Moving through the control room: Tab between the panels (one the layout has no room for opens
zoomed), the zoom key, the log search and the loss plot's scale. The control room's base class
above `ActionFlow`; the app hands it its panels."""

from __future__ import annotations

from typing import Protocol

from textual.widget import Widget

from .action_flow import ActionFlow
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


class Navigation(ActionFlow):
    """Focus, zoom, search and plot scale: keys that move, never act on the run."""

    def panels(self) -> PanelSet:
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
            self.notify(f"search: no line of the last {len(log.view or ())} holds {pattern!r}", timeout=4)

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
