"""Moving through the control room: Tab between the panels (one the layout has no room for opens
zoomed), the number keys to a panel, the zoom key (and the focus back in sight after it), the log search, the loss plot's scale, and the runs overview. The control
room holds it as a part and hands it its panels and its run."""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Protocol

from textual.app import App
from textual.widget import Widget

from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from .link import OverviewReader
from .overview import RunRow, row_of
from .widgets.logtail import LogTailPanel
from .widgets.loss import LossPanel

if TYPE_CHECKING:  # the screens load when first opened, not before the first frame
    from .screens.runs import RunsScreen


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


class NavigationHost(Protocol):
    """What moving through the control room asks of it: its panels, its run, its state and the
    lock the reader folds under, the overview's reader, and how to follow another run."""

    @property
    def run_info(self) -> RunInfo | None: ...

    @property
    def state(self) -> RunState | None: ...

    @property
    def connected(self) -> bool: ...

    @property
    def lock(self) -> threading.Lock: ...

    @property
    def overview(self) -> OverviewReader: ...

    def clock(self) -> float: ...

    def panels(self) -> PanelSet: ...

    def switch_run(self, run_id: str) -> None: ...


class Navigation:
    """Focus, zoom, search, plot scale and the runs: keys that move, never act on a run. A part
    of the control room (`app`), which it asks through `host`."""

    def __init__(self, app: App[int], host: NavigationHost) -> None:
        self.app = app
        self.host = host
        self._watched: set[object] = set()  # the screens whose zoom is watched
        self._home: Widget | None = None  # the panel in sight focused before a zoom
        # The runs overview's filter and order, kept from one opening to the next (k9s keeps them).
        self._runs_view: tuple[str, str, bool] = ("", "age", False)

    def jump(self, n: int) -> None:
        """A number key: the panel whose border shows that number (1..9, then 0 for the tenth)."""
        order = self.host.panels().in_order()
        i = (n - 1) % 10
        # Over another screen (the runs overview) a digit is that screen's, not a jump behind it.
        if i < len(order) and order[i].screen is self.app.screen:
            self.show_panel(order[i])

    def move_focus(self, step: int) -> None:
        """Tab (1) and shift+tab (-1): the next or previous panel; over the command line (whose
        own tab binding this priority one would shadow), its completion."""
        complete = getattr(self.app.screen, "complete_on_tab", None)
        if callable(complete):
            complete()
            return
        order = self.host.panels().in_order()
        focused = self.app.focused
        if focused in order:
            i = (order.index(focused) + step) % len(order)
        else:
            i = 0 if step > 0 else len(order) - 1
        self.show_panel(order[i])

    def show_panel(self, panel: Widget) -> None:
        """Focus `panel`; zoomed when the layout has no room for it (the ranks and the log at 24
        rows), else in its place."""
        screen = self.app.screen
        if not laid_out(panel):
            self._maximize(panel)
        elif screen.maximized is not None:
            screen.minimize()
        panel.focus()

    def zoom(self) -> None:
        screen = self.app.screen
        if screen.maximized is not None:
            screen.minimize()
            return
        focused = self.app.focused
        if focused not in self.host.panels().in_order():
            self.app.notify("zoom: focus a panel first (tab moves between them)", timeout=3)
            return
        assert focused is not None
        self._maximize(focused)

    def _maximize(self, panel: Widget) -> None:
        """Zoom `panel`; once it is put back (z or escape), the focus is on a panel in sight."""
        screen = self.app.screen
        if screen not in self._watched:
            self._watched.add(screen)
            screen.watch(screen, "maximized", self._zoom_changed, init=False)
        focused = self.app.focused
        if focused is not None and laid_out(focused) and focused in self.host.panels().in_order():
            self._home = focused
        screen.maximize(panel, container=False)

    def _zoom_changed(self, maximized: Widget | None) -> None:
        if maximized is None:
            self.app.call_after_refresh(self._focus_in_sight)

    def _focus_in_sight(self) -> None:
        """After a zoom ends: a panel the layout hides (the log at 24 rows) gives the focus back
        to the panel focused before the zoom, else to the first one in sight."""
        focused = self.app.focused
        if self.app.screen.maximized is not None or (focused is not None and laid_out(focused)):
            return
        order = self.host.panels().in_order()
        home = self._home if self._home is not None and laid_out(self._home) else None
        target = home or next((p for p in order if laid_out(p)), None)
        if target is not None:
            target.focus()

    def search(self) -> None:
        log = self.host.panels().log
        if not log.view:
            self.app.notify("search: the trainer log is empty so far", severity="warning", timeout=3)
            return
        from .screens.search import SearchPrompt

        self.app.push_screen(SearchPrompt(log.pattern), self._search_for)

    def _search_for(self, pattern: str | None) -> None:
        if not pattern:
            return
        log = self.host.panels().log
        self.show_panel(log)
        if not log.search(pattern):
            self.app.notify(
                f"search: no line of the last {len(log.view or ())} holds {pattern!r}",
                timeout=4,
                markup=False,
            )

    def log_scale(self) -> None:
        loss = self.host.panels().loss
        loss.log_y = not loss.log_y
        self.app.notify("loss plot: log scale" if loss.log_y else "loss plot: linear scale", timeout=2)

    def recent_window(self) -> None:
        loss = self.host.panels().loss
        loss.recent = not loss.recent
        self.app.notify(
            "loss plot: the recent fifth of the run, fitted" if loss.recent else "loss plot: the whole run",
            timeout=2,
        )

    # ------------------------------------------------------------------ the runs overview

    def runs(self, filter_text: str | None = None) -> None:
        """The runs overview, with the filter and order it had when last closed (or `filter_text`)."""
        from .screens.runs import RunsScreen

        host = self.host
        screen = RunsScreen([], host.clock(), host.run_info.run_id if host.run_info else None)
        screen.filter, screen.sort_by, screen.reverse = self._runs_view
        if filter_text is not None:
            screen.filter = filter_text
        self.app.push_screen(screen, partial(self._overview_closed, screen))
        self.refresh_overview(screen)

    def refresh_overview(self, screen: RunsScreen) -> None:
        """Its rows again now, then every OVERVIEW_INTERVAL_S while it is open (the startup
        picker's too: its figures move as the runs do)."""
        self._refresh_overview(screen)

    def _refresh_overview(self, screen: RunsScreen) -> None:
        self.app.run_worker(
            partial(self._overview_worker, screen),
            thread=True,
            exclusive=True,
            group="overview",
            exit_on_error=False,
        )

    def _overview_worker(self, screen: RunsScreen) -> None:
        host, current = self.host, None
        with host.lock:  # only the followed run's row: the reader folds into its state
            if host.run_info is not None and host.state is not None:
                current = row_of(host.run_info, host.state, host.connected)
        rows = host.overview.rows(current)
        self.app.call_from_thread(self._overview_rows, screen, rows)

    def _overview_rows(self, screen: RunsScreen, rows: list[RunRow]) -> None:
        if screen.is_attached:
            screen.update_rows(rows, self.host.clock())
            self.app.set_timer(OVERVIEW_INTERVAL_S, partial(self._refresh_overview, screen))

    def _overview_closed(self, screen: RunsScreen, run_id: str | None) -> None:
        self._runs_view = (screen.filter, screen.sort_by, screen.reverse)
        if run_id is not None:
            self.host.switch_run(run_id)
