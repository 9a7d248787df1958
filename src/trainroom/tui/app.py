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

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from trainroom.core.run import store as runs_store
from trainroom.core.run.attach import take_up
from trainroom.core.run.gone import KeeperGone, keeper_gone
from trainroom.core.run.live import trainer_runs
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import LOG_NAME, RunError, RunInfo

from . import figures, theming, verdict
from .action_flow import ActionFlow, CancelKey
from .bindings import COMMANDS, KEEPER_ACTIONS, bindings, held_by_a_box, key_label, key_of
from .cmdline import CommandLineKey
from .firstscreen import SizedFirstScreen
from .graphs import HistoryKeys
from .link import KeeperLink, LocalRuns, OverviewReader, RunSource
from .messages import Attached, KeeperLost, LogTailChanged, RunChanged
from .navigation import Navigation
from .overview import RunRow
from .panels import Panels
from .processes import ProcessesKey
from .reader import series_for
from .screens import lazy as screens  # each screen loads when first opened, after the first frame
from .verdict import FindingRow, FindingsView, Situation
from .watch import RunWatch
from .widgets.actionstrip import ActionStrip
from .widgets.banner import BannerView, DisconnectBanner
from .widgets.cadence import CadencePanel
from .widgets.disk import DiskPanel
from .widgets.findings import FindingsPanel
from .widgets.header import RunHeader
from .widgets.host import HostPanel
from .widgets.keystrip import KeyStrip, key_strip_view
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


class ControlRoom(SizedFirstScreen, CancelKey, ProcessesKey, HistoryKeys, CommandLineKey, App[int]):
    """`ControlRoom(run_id, theme)`: watch RUN (an id, a unique prefix, a run dir), or with no
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

    def panels(self) -> Panels:
        if self._panels is None:
            self._panels = Panels.of(self)
        return self._panels

    # ------------------------------------------------------------------ finding the run

    @work(thread=True, exclusive=True, group="attach", exit_on_error=False)
    def _find_run(self) -> None:
        if self.run_id:
            info = self.source.resolve(self.run_id)
            self.call_from_thread(self._open_run, info)
            return
        runs = self.source.list_runs()
        live = [r for r in runs if trainer_runs(r)]  # a trainer runs: a lingering keeper is not live
        if len(live) == 1:
            self.call_from_thread(self._open_run, live[0])
        elif len(live) > 1:
            rows = self.overview.rows()
            self.call_from_thread(self._pick_run, rows, len(live))
        elif runs:
            self.call_from_thread(self._open_run, max(runs, key=lambda r: r.created))
        else:
            self.call_from_thread(self._no_runs)

    def _pick_run(self, rows: list[RunRow], live: int) -> None:
        title = f"{live} runs training (of {len(rows)}): pick one"
        screen = screens.runs()(rows, self.clock(), None, title)
        self.push_screen(screen, partial(self._picked, rows))
        self.nav.refresh_overview(screen)  # live figures, as the overview's

    def _picked(self, rows: list[RunRow], run_id: str | None) -> None:
        # Esc is back, never a silent quit: to the newest run training, said (q quits).
        live = [r for r in rows if r.training]
        if run_id is None and live:
            run_id = max(live, key=lambda r: r.created).run_id
            self.notify(f"no run picked: watching the newest run training, {run_id} (o: the runs)", timeout=6)
        if run_id is None:
            self.exit(0)
        else:
            self.switch_run(run_id)

    def _no_runs(self) -> None:
        self.query_one(RunHeader).view = None
        if not self._said_no_runs:
            self._said_no_runs = True
            self.notify(
                "no runs yet: start one with `trainroom launch -- python train.py`",
                title="nothing to watch",
                severity="warning",
                timeout=30,
            )
        self.set_timer(self.reconnect_interval_s, self._find_run)  # watch for the first one

    def _open_run(self, info: RunInfo) -> None:
        """Watch `info`: its keeper when alive, else the journal's last state."""
        self.run_info = info
        self.run_id = info.sock if info.remote else info.run_id  # a remote run is found again by its address
        self.sub_title = info.run_id
        self.run_watch.tail_log(Path(info.run_dir) / LOG_NAME)
        if not info.alive:
            # Gone since its journal's last write at the latest (a keeper killed -9 says no more).
            self._keeper_gone("the keeper is not running", runs_store.last_write(info) or self.clock())
            return
        try:
            link = self.source.connect(info)
        except Exception as exc:  # a socket that vanished between the listing and now
            self._keeper_gone(str(exc) or type(exc).__name__, self.clock())
            return
        self.run_watch.follow(link)

    def switch_run(self, run_id: str) -> None:
        """Watch another run in this same control room (the runs overview's Enter)."""
        if run_id == self.run_id and self.state is not None:
            return
        self.run_watch.stop()
        with self.lock:
            self.state, self.series = None, None
        self.connected, self.gone_since, self.gone_reason, self.gone = False, None, "", None
        self.log_lines, self.findings_now = (), None
        p = self.panels()
        p.clear_views()
        p.banner.display = False
        self.run_id = run_id
        self._find_run()

    def on_attached(self, message: Attached) -> None:
        if not self.run_watch.hears(message.reader):
            return
        with self.lock:
            self.state, self.series = message.state, message.series
        self.connected, self.gone_since, self.gone_reason, self.keeper_busy = True, None, "", False
        self.query_one(DisconnectBanner).display = False
        self.redraw()

    def on_run_changed(self, message: RunChanged) -> None:
        if message.urgent:
            self._urgent = True
        else:
            self._dirty = True

    def on_log_tail_changed(self, message: LogTailChanged) -> None:
        self.log_lines = message.lines
        self._dirty = True

    def on_keeper_lost(self, message: KeeperLost) -> None:
        if self.run_watch.hears(message.reader):
            self._keeper_gone(message.reason, message.t)

    def _keeper_gone(self, reason: str, t: float) -> None:
        self.connected = False
        self.run_watch.drop_keeper()
        self.gone_since, self.gone_reason, self.gone = t, reason, None
        self.query_one(DisconnectBanner).display = True
        self._load_journal()
        self.redraw()

    @work(thread=True, exclusive=True, group="journal", exit_on_error=False)
    def _load_journal(self) -> None:
        """The journal's last state: what the keeper had written when it went away."""
        if self.run_info is None:
            return
        view = self.source.load_view(self.run_info)
        try:
            busy = self.source.resolve(self.run_info.run_id).alive  # its process, by pid and start
        except (RunError, OSError):
            busy = False
        gone = None if busy else keeper_gone(view.state, self.run_info)
        self.call_from_thread(self._journal_loaded, view.state, series_for(view), busy, gone)

    def _journal_loaded(self, state: RunState, series: Series, busy: bool, gone: KeeperGone | None) -> None:
        if self.connected:
            return  # the keeper came back meanwhile: its snapshot is newer
        self.keeper_busy, self.gone = busy, gone
        with self.lock:
            self.state, self.series = state, series
        self.redraw()
        self.set_timer(self.reconnect_interval_s, self._look_for_keeper)

    @work(thread=True, exclusive=True, group="reconnect", exit_on_error=False)
    def _look_for_keeper(self) -> None:
        """Re-armed only after it ends (a timer set at its end, not an interval), so polls never overlap."""
        if self.connected or self.run_id is None:
            return
        try:
            info: RunInfo | None = self.source.resolve(self.run_id)
        except (RunError, OSError):
            info = None
        if info is not None and info.alive:
            self.call_from_thread(self._open_run, info)
        else:
            state, was = self.state, self.gone
            if not self.keeper_busy and state is not None and info is not None:
                self.gone, self._dirty = keeper_gone(state, info), True
                if self.gone is not None and was is not None and self.gone.since != was.since:
                    # Written since (a kill from a shell): read again; its end sets the next poll.
                    self.call_from_thread(self._load_journal)
                    return
            self.call_from_thread(self.set_timer, self.reconnect_interval_s, self._look_for_keeper)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """A failure of the workers that find and follow the run lands here, in one handler rather
        than a try in each worker; the action workers' are `ActionFlow`'s."""
        self.flow.worker_changed(event)
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        text = str(error) or type(error).__name__
        group = event.worker.group
        if group == "attach":
            self.notify(text, title="cannot watch that run", severity="error", timeout=30)
        elif group == "journal":
            self.notify(f"journal unreadable: {text}", severity="error", timeout=10, markup=False)
            if self.run_id is not None:
                self.set_timer(self.reconnect_interval_s, self._look_for_keeper)
        elif group == "reconnect":
            self.set_timer(self.reconnect_interval_s, self._look_for_keeper)
        elif group == "overview":
            self.notify(f"runs overview: {text}", severity="error", timeout=10, markup=False)

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

    # ------------------------------------------------------------------ the keys, to the parts
    # (each keeper action's key is `act`, bound below the class for every action of the registry)

    def act(self, action: str) -> None:
        """A keeper action's key: on the finding whose own target it acts on now, if any."""
        self.flow.start(action, self.key_target(action))

    def action_next_panel(self) -> None:
        self.nav.move_focus(1)

    def action_previous_panel(self) -> None:
        self.nav.move_focus(-1)

    def action_zoom(self) -> None:
        self.nav.zoom()

    def action_search(self) -> None:
        self.nav.search()

    def action_log_scale(self) -> None:
        self.nav.log_scale()

    def action_recent_window(self) -> None:
        self.nav.recent_window()

    def action_runs(self) -> None:
        self.nav.runs()

    def action_jump(self, n: int) -> None:
        self.nav.jump(n)

    # ------------------------------------------------------------------ which actions apply

    def key_text(self, action: str) -> str:
        """The key `action` is on now, as the screen writes it (`^k`, `R`)."""
        return key_label(key_of(action, self.keys_in_use))

    def situation(self) -> Situation:
        return Situation(connected=self.connected, busy=self.flow.current, has_run=self.run_info is not None)

    def why_not(self, action: str, finding: str | None = None) -> str | None:
        return verdict.refusal(self.state, action, self.situation(), finding)

    def key_target(self, action: str) -> FindingRow | None:
        return self._target_of(self.findings_now.open if self.findings_now is not None else (), action)

    def _target_of(self, rows: tuple[FindingRow, ...], action: str = "kill") -> FindingRow | None:
        """What an action's key acts on (a kill's): the finding under the cursor when the findings
        have the focus (its target when it names one, else the trainer); the trainer when the
        trainer panel has it; otherwise the first finding that names a target, else the trainer."""
        targeted = [r for r in rows if r.action == action and r.targeted]
        focused = self.focused
        if isinstance(focused, FindingsPanel):
            row = focused.selected_row()
            return next((r for r in targeted if row is not None and r.ident == row.ident), None)
        if isinstance(focused, TrainerPanel):
            return None
        return targeted[0] if targeted else None

    def keeper_link(self) -> KeeperLink:
        if self.run_watch.link is not None:
            return self.run_watch.link
        if self.run_info is None:
            raise RunError("no run to act on")
        info = self.run_info
        resuming = self.flow.current == "resume"
        if (
            resuming
            and not self.connected
            and not info.remote
            and not runs_store.resolve_run(info.run_id).alive
        ):
            # Only a resume acts with the keeper gone (verdict.refusal): a new keeper takes the
            # run up (same run, its journal) and the resume goes through it as the next attempt.
            info = take_up(info)
        return self.source.connect(info)  # the keeper may be back; if not, this says so

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """Each command once: Textual's own, less those the control room has its own key for."""
        ours = {"Quit", "Maximize", "Minimize", "Keys"}
        for command in super().get_system_commands(screen):
            if command.title not in ours:
                yield command
        for c in COMMANDS:
            if c.action == "next_theme":
                continue  # Textual's "Theme" picks one, with a preview
            why = self.why_not(c.action) if c.action in KEEPER_ACTIONS else None
            help_text = c.tooltip + (f" (not now: {why})" if why else "")
            yield SystemCommand(
                f"{c.label.capitalize()} ({self.key_text(c.action)})",
                help_text,
                partial(self.run_action, c.action),
            )

    def action_help(self) -> None:
        self.push_screen(screens.help()({a: self.why_not(a) for a in KEEPER_ACTIONS}, self.keys_in_use))

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
