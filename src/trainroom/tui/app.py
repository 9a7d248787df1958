"""The control room: a pure client of a run's keeper.

Threads speak to the UI only through messages: the keeper reader and the log tail are plain
threads (no Textual in their modules, started and stopped by `watch.RunWatch`) that post small
messages; finding the run, reading its journal and looking for its keeper are thread workers that
hand their results back with `call_from_thread`, as the actions do (`action_flow`). Records are
folded into the run's state by the reader under a lock; the app renders from that state at most
ten times a second (a timer checks a dirty flag), and once a second anyway so ages keep moving.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from importlib.abc import Traversable
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Grid, Horizontal, Vertical

from trainroom.core.run.gone import KeeperGone
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from . import theming, verdict
from .action_flow import ActionFlow, CancelKey
from .bindings import KEEPER_ACTIONS, bindings, held_by_a_box
from .cmdline import CommandLineKey
from .firstscreen import SizedFirstScreen
from .following import Following
from .graphs import HistoryKeys
from .link import LocalRuns, OverviewReader, RunSource
from .navigation import Navigation
from .panels import Panels
from .processes import ProcessesKey
from .screens import lazy as screens  # each screen loads when first opened, after the first frame
from .verdict import FindingRow, FindingsView
from .watch import RunWatch
from .widgets.actionstrip import ActionStrip
from .widgets.banner import DisconnectBanner
from .widgets.cadence import CadencePanel
from .widgets.disk import DiskPanel
from .widgets.findings import FindingsPanel
from .widgets.header import RunHeader
from .widgets.host import HostPanel
from .widgets.keystrip import KeyStrip
from .widgets.logtail import LogTailPanel
from .widgets.loss import LossPanel
from .widgets.lr import LrPanel
from .widgets.ranks import RanksPanel
from .widgets.trainer import TrainerPanel
from .widgets.vram import VramPanel

# What changes the verdict (a state, a finding, an attempt, a checkpoint) is drawn within
# URGENT_INTERVAL_S; routine telemetry (steps, heartbeats, probes) at most every ROUTINE_INTERVAL_S,
# as a terminal monitor refreshes: a person reads a figure a second, and every frame Textual
# composes costs CPU (a frame per step took 13 % of a core at 10 steps/s).
URGENT_INTERVAL_S = 0.25
ROUTINE_INTERVAL_S = 1.0
RENDER_INTERVAL_S = URGENT_INTERVAL_S  # (the name tests and callers pass)
TICK_INTERVAL_S = 1.0  # ages ("last step 4 s ago") move even when nothing arrives
RECONNECT_INTERVAL_S = 2.0  # while the keeper is gone, look for it coming back


class ControlRoom(SizedFirstScreen, CancelKey, ProcessesKey, HistoryKeys, CommandLineKey, Following):
    """`ControlRoom(run_id, theme)`: watch RUN (an id, a unique prefix, a name, a run dir), or with no
    run the newest live one (the runs overview when several)."""

    CSS_PATH = "control_room.tcss"
    TITLE = "trainroom"
    BINDINGS: ClassVar[list[BindingType]] = list(bindings())
    # The findings have the focus at first (their cursor on the worst), as a k9s or lazygit list
    # does: a fix key acts on the finding under the cursor (see `key_target`).
    AUTO_FOCUS = "#findings"
    # A zoomed panel keeps the header (the verdict) and the key strip in sight.
    ALLOW_IN_MAXIMIZED_VIEW = "#header, #bottom-bar"
    # Not ClassVars: Textual declares them `ClassVar[...] | None`, which type-checks as an
    # instance variable that a ClassVar may not override. Never mutated.
    HORIZONTAL_BREAKPOINTS: list[tuple[int, str]] | None = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS: list[tuple[int, str]] | None = [(0, "-short"), (36, "-tall")]  # noqa: RUF012

    def __init__(
        self,
        run_id: str | None = None,
        theme: str | None = None,
        *,
        source: RunSource | None = None,
        clock: Callable[[], float] = time.time,
        theme_dirs: Iterable[Path | Traversable] | None = None,
        render_interval_s: float = RENDER_INTERVAL_S,
        routine_interval_s: float = ROUTINE_INTERVAL_S,
        reconnect_interval_s: float = RECONNECT_INTERVAL_S,
        keymap: dict[str, str] | None = None,
    ) -> None:
        self.loaded_themes = theming.load_themes(
            theme_dirs if theme_dirs is not None else theming.default_dirs()
        )
        super().__init__()
        self.run_id = run_id
        self.source: RunSource = source if source is not None else LocalRuns()
        self.overview = OverviewReader(self.source)
        self.clock = clock
        self.render_interval_s = render_interval_s
        self.routine_interval_s = routine_interval_s
        self.reconnect_interval_s = reconnect_interval_s
        self.keys_in_use: dict[str, str] = dict(keymap or {})
        self.run_info: RunInfo | None = None
        self.state: RunState | None = None
        self.series: Series | None = None  # the loss plot's store, folded by the reader
        self.lock = threading.Lock()
        self.run_watch = RunWatch(self.post_message, self.lock, clock)
        self.connected = False
        self.gone_since: float | None = None
        self.gone_reason = ""
        self.keeper_busy = False  # not connected, but the keeper's process lives
        self.gone: KeeperGone | None = None  # the trainer orphaned or ended unseen (`status`'s words)
        self.log_lines: tuple[str, ...] = ()
        self.renders = 0
        self._dirty = False  # routine telemetry came: drawn at the next routine frame
        self._urgent = False  # the verdict may have changed: drawn at the next tick
        self._panels: Panels | None = None
        self._drawn_at = -1e9  # when the panels were last drawn (monotonic)
        self._aim: tuple[object, str | None] = (None, None)  # the focus and the findings' cursor
        self.findings_now: FindingsView | None = None
        self.theme_notice: str | None = None  # what was said about theme files, once
        self._said_no_runs = False
        # Its parts: the actions (one under way at a time) and moving through the panels.
        self.flow = ActionFlow(self, self)
        self.nav = Navigation(self, self)
        for t in self.loaded_themes.themes:
            self.register_theme(t)
        self.theme, self._theme_note = theming.initial_theme(
            self.loaded_themes,
            theme,
            no_color=self.no_color,
            builtin=self.available_themes.get,
            remembered=theming.remembered(),
        )

    # ------------------------------------------------------------------ themes

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theming.app_variables(self.current_theme)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not held_by_a_box(self.screen, action)  # a box on top owns the keyboard

    def action_next_theme(self) -> None:
        names = self.loaded_themes.names() or list(self.available_themes)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        said = theming.remember(self.theme)  # the next session opens with it
        self.notify(f"theme: {theming.short_name(self.theme)}" + (f" ({said})" if said else ""), timeout=2)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        yield DisconnectBanner(id="banner")
        with Grid(id="vitals"):
            yield TrainerPanel(id="trainer", classes="panel")
            yield VramPanel(id="vram", classes="panel")
            yield CadencePanel(id="cadence", classes="panel")
            yield LrPanel(id="lr", classes="panel")
        with Horizontal(id="middle"):
            yield LossPanel(id="loss", classes="panel")
            with Vertical(id="side"):
                yield HostPanel(id="host", classes="panel")
                yield DiskPanel(id="disk", classes="panel")
        yield FindingsPanel(id="findings", classes="panel")
        with Horizontal(id="bottom"):
            yield RanksPanel(id="ranks", classes="panel")
            yield LogTailPanel(id="log", classes="panel")
        with Vertical(id="bottom-bar"):
            yield ActionStrip(id="action-strip")
            yield KeyStrip(id="key-strip")

    def on_mount(self) -> None:
        if self.keys_in_use:
            self.set_keymap(self.keys_in_use)
        notes = list(self.loaded_themes.errors)
        if self._theme_note:
            notes.append(self._theme_note)
        if notes:
            # Once, all together: a bad theme file is named with its error and skipped.
            self.theme_notice = "\n".join(notes)
            self.notify(
                self.theme_notice, title="theme files skipped", severity="warning", timeout=12, markup=False
            )
        self.query_one(ActionStrip).display = False
        self.query_one(DisconnectBanner).display = False
        self.set_interval(self.render_interval_s, self._render_if_dirty)
        self.set_interval(TICK_INTERVAL_S, self._tick)
        self._find_run()

    def on_unmount(self) -> None:
        self.run_watch.stop()

    # ------------------------------------------------------------------ the findings

    @on(FindingsPanel.Open)
    def _open_finding(self, event: FindingsPanel.Open) -> None:
        row = event.row
        self.push_screen(screens.finding()(row, self.clock()), partial(self._finding_closed, row))

    def _finding_closed(self, row: FindingRow, act: bool | None) -> None:
        if act and row.action:
            self.flow.start(row.action, row if row.targeted else None)

    def farewell(self) -> str | None:
        """What to print once the control room has closed (see `verdict.farewell`)."""
        if self.run_info is None:
            return None
        return verdict.farewell(self.run_info.run_id, self.state, self.connected)


def _key_of_action(action: str) -> Callable[[ControlRoom], None]:
    def key(room: ControlRoom) -> None:
        room.act(action)

    key.__doc__ = f"The {action} key (Textual finds it as `action_{action}`)."
    return key


for _name in KEEPER_ACTIONS:
    setattr(ControlRoom, f"action_{_name}", _key_of_action(_name))
