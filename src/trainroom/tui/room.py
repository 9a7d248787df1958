"""What the control room holds, as its roles read it: each attribute below is assigned once, in
`app.ControlRoom.__init__`. The room is one Textual `App` built in layers, each in its own module and
each using only those below it: this one (and the panels, found once), the keys (`keys`: what each
key does and whether it acts now), the refresh (`refresh`: the panels drawn from the state), finding
and following the run (`following`), and the app itself (`app`: its parts, themes and layout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from textual.app import App

from trainroom.core.run.gone import KeeperGone
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from .action_flow import ActionFlow
from .link import OverviewReader, RunSource
from .navigation import Navigation
from .panels import Panels
from .verdict import FindingsView
from .watch import RunWatch


class Room(App[int]):
    """The control room's state and parts (assigned by `ControlRoom.__init__`)."""

    run_id: str | None
    source: RunSource
    overview: OverviewReader
    clock: Callable[[], float]
    routine_interval_s: float
    reconnect_interval_s: float
    keys_in_use: dict[str, str]
    run_info: RunInfo | None
    state: RunState | None
    series: Series | None
    lock: threading.Lock
    run_watch: RunWatch
    connected: bool
    gone_since: float | None
    gone_reason: str
    keeper_busy: bool
    gone: KeeperGone | None
    log_lines: tuple[str, ...]
    renders: int
    _dirty: bool
    _urgent: bool
    _panels: Panels | None
    _drawn_at: float
    _aim: tuple[object, str | None]
    findings_now: FindingsView | None
    _said_no_runs: bool
    flow: ActionFlow
    nav: Navigation

    def panels(self) -> Panels:
        if self._panels is None:
            self._panels = Panels.of(self)
        return self._panels
