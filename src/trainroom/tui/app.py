"""The control room: a pure client of a run's keeper.

Threads speak to the UI only through messages: the keeper reader and the log tail are plain
threads (no Textual in their modules, started and stopped by `watch.RunWatch`) that post small
messages; finding the run, reading its journal and looking for its keeper are thread workers that
hand their results back with `call_from_thread`, as the actions do (`action_flow`). Records are
folded into the run's state by the reader under a lock; the app renders from that state at most
ten times a second (a timer checks a dirty flag), and once a second anyway so ages keep moving.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from importlib.abc import Traversable
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import LOG_NAME, RunError, RunInfo
from trainroom.core.run.summary import RunSummary

from . import figures, theming
from .action_flow import ActionFlow
from .bindings import BINDINGS, KEEPER_ACTIONS
from .link import KeeperLink, LocalRuns, RunSource
from .messages import Attached, KeeperLost, LogTailChanged, RunChanged
from .reader import series_for
from .screens.help import HelpScreen
from .screens.picker import RunPicker
from .watch import RunWatch
from .widgets.actionstrip import ActionStrip
from .widgets.banner import BannerView, DisconnectBanner
from .widgets.cadence import CadencePanel
from .widgets.disk import DiskPanel
from .widgets.findings import FindingsPanel
from .widgets.header import RunHeader
from .widgets.host import HostPanel
from .widgets.logtail import LogTailPanel
from .widgets.loss import LossPanel
from .widgets.lr import LrPanel
from .widgets.ranks import RanksPanel
from .widgets.trainer import TrainerPanel
from .widgets.vram import VramPanel

RENDER_INTERVAL_S = 0.1  # at most ~10 renders a second, however fast records come
SLOW_RENDER_INTERVAL_S = 0.5  # the loss curve and the ranks table: at most twice a second
TICK_INTERVAL_S = 1.0  # ages ("last step 4 s ago") move even when nothing arrives
RECONNECT_INTERVAL_S = 2.0  # while the keeper is gone, look for it coming back


@dataclass(frozen=True)
class Panels:
    """Every panel, found once: a DOM query per panel per render is a real share of the TUI's CPU."""

    header: RunHeader
    trainer: TrainerPanel
    vram: VramPanel
    cadence: CadencePanel
    lr: LrPanel
    host: HostPanel
    disk: DiskPanel
    findings: FindingsPanel
    loss: LossPanel
    ranks: RanksPanel
    log: LogTailPanel
    banner: DisconnectBanner

    @classmethod
    def of(cls, app: ControlRoom) -> Panels:
        q = app.query_one
        return cls(
            header=q(RunHeader),
            trainer=q(TrainerPanel),
            vram=q(VramPanel),
            cadence=q(CadencePanel),
            lr=q(LrPanel),
            host=q(HostPanel),
            disk=q(DiskPanel),
            findings=q(FindingsPanel),
            loss=q(LossPanel),
            ranks=q(RanksPanel),
            log=q(LogTailPanel),
            banner=q(DisconnectBanner),
        )


class ControlRoom(ActionFlow):
    """`ControlRoom(run_id, theme)`: watch RUN (an id, a unique prefix, a run dir), or with no
    run the newest live one (a picker when several)."""

    CSS_PATH = "control_room.tcss"
    TITLE = "trainroom"
    BINDINGS: ClassVar[list[BindingType]] = list(BINDINGS)
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
        reconnect_interval_s: float = RECONNECT_INTERVAL_S,
    ) -> None:
        self.loaded_themes = theming.load_themes(
            theme_dirs if theme_dirs is not None else theming.default_dirs()
        )
        super().__init__()
        self.run_id = run_id
        self.source: RunSource = source if source is not None else LocalRuns()
        self.clock = clock
        self.render_interval_s = render_interval_s
        self.reconnect_interval_s = reconnect_interval_s
        self.run_info: RunInfo | None = None
        self.state: RunState | None = None
        self.series: Series | None = None  # the loss plot's store, folded by the reader
        self.lock = threading.Lock()
        self.run_watch = RunWatch(self.post_message, self.lock, clock)
        self.connected = False
        self.gone_since: float | None = None
        self.gone_reason = ""
        self.log_lines: tuple[str, ...] = ()
        self.renders = 0
        self._dirty = False
        self._panels: Panels | None = None
        self._slow_at = -1e9  # when the curve and the ranks table were last drawn (monotonic)
        self._availability: tuple[bool, ...] = ()
        self.theme_notice: str | None = None  # what was said about theme files, once
        self._said_no_runs = False
        for t in self.loaded_themes.themes:
            self.register_theme(t)
        self.theme, self._theme_note = theming.initial_theme(
            self.loaded_themes, theme, no_color=self.no_color, builtin=self.available_themes.get
        )

    # ------------------------------------------------------------------ themes

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theming.app_variables(self.current_theme)

    def action_next_theme(self) -> None:
        names = self.loaded_themes.names() or list(self.available_themes)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme: {self.theme}", timeout=2)

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
        yield ActionStrip(id="action-strip")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        notes = list(self.loaded_themes.errors)
        if self._theme_note:
            notes.append(self._theme_note)
        if notes:
            # Once, all together: a bad theme file is named with its error and skipped.
            self.theme_notice = "\n".join(notes)
            self.notify(self.theme_notice, title="theme files skipped", severity="warning", timeout=12)
        self.query_one(ActionStrip).display = False
        self.query_one(DisconnectBanner).display = False
        self.set_interval(self.render_interval_s, self._render_if_dirty)
        self.set_interval(TICK_INTERVAL_S, self._tick)
        self._find_run()

    def on_unmount(self) -> None:
        self.run_watch.stop()

    # ------------------------------------------------------------------ finding the run

    @work(thread=True, exclusive=True, group="attach", exit_on_error=False)
    def _find_run(self) -> None:
        if self.run_id:
            info = self.source.resolve(self.run_id)
            self.call_from_thread(self._open_run, info)
            return
        runs = self.source.list_runs()
        live = [r for r in runs if r.alive]
        if len(live) == 1:
            self.call_from_thread(self._open_run, live[0])
        elif len(live) > 1:
            self.call_from_thread(self._pick_run, live, {r.run_id: self.source.summary(r) for r in live})
        elif runs:
            self.call_from_thread(self._open_run, max(runs, key=lambda r: r.created))
        else:
            self.call_from_thread(self._no_runs)

    def _pick_run(self, live: list[RunInfo], summaries: dict[str, RunSummary | None]) -> None:
        self.push_screen(RunPicker(live, summaries), self._picked)

    def _picked(self, info: RunInfo | None) -> None:
        if info is None:
            self.exit(0)
        else:
            self._open_run(info)

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
        self.run_id = info.run_id
        self.sub_title = info.run_id
        self.run_watch.tail_log(Path(info.run_dir) / LOG_NAME)
        if not info.alive:
            self._keeper_gone("the keeper is not running", self.clock())
            return
        try:
            link = self.source.connect(info)
        except Exception as exc:  # a socket that vanished between the listing and now
            self._keeper_gone(str(exc) or type(exc).__name__, self.clock())
            return
        self.run_watch.follow(link)

    def on_attached(self, message: Attached) -> None:
        if not self.run_watch.hears(message.reader):
            return
        with self.lock:
            self.state, self.series = message.state, message.series
        self.connected, self.gone_since, self.gone_reason = True, None, ""
        self.query_one(DisconnectBanner).display = False
        self.redraw()

    def on_run_changed(self, message: RunChanged) -> None:
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
        self.gone_since, self.gone_reason = t, reason
        self.query_one(DisconnectBanner).display = True
        self._load_journal()
        self.redraw()

    @work(thread=True, exclusive=True, group="journal", exit_on_error=False)
    def _load_journal(self) -> None:
        """The journal's last state: what the keeper had written when it went away."""
        if self.run_info is None:
            return
        view = self.source.load_view(self.run_info)
        self.call_from_thread(self._journal_loaded, view.state, series_for(view))

    def _journal_loaded(self, state: RunState, series: Series) -> None:
        if self.connected:
            return  # the keeper came back meanwhile: its snapshot is newer
        with self.lock:
            self.state, self.series = state, series
        self.redraw()
        self.set_timer(self.reconnect_interval_s, self._look_for_keeper)

    @work(thread=True, exclusive=True, group="reconnect", exit_on_error=False)
    def _look_for_keeper(self) -> None:
        """Re-armed only after it ends (dolphie's way), so polls never overlap."""
        if self.connected or self.run_id is None:
            return
        try:
            info: RunInfo | None = self.source.resolve(self.run_id)
        except (RunError, OSError):
            info = None
        if info is not None and info.alive:
            self.call_from_thread(self._open_run, info)
        else:
            self.call_from_thread(self.set_timer, self.reconnect_interval_s, self._look_for_keeper)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """A failure of the workers that find and follow the run lands here, once (harlequin's
        way); the action workers' are `ActionFlow`'s."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        text = str(error) or type(error).__name__
        group = event.worker.group
        if group == "attach":
            self.notify(text, title="cannot watch that run", severity="error", timeout=30)
        elif group == "journal":
            self.notify(f"journal unreadable: {text}", severity="error", timeout=10)
            if self.run_id is not None:
                self.set_timer(self.reconnect_interval_s, self._look_for_keeper)
        elif group == "reconnect":
            self.set_timer(self.reconnect_interval_s, self._look_for_keeper)

    # ------------------------------------------------------------------ rendering

    def _tick(self) -> None:
        self._dirty = True

    def _render_if_dirty(self) -> None:
        if self._dirty and self.is_running:
            self.redraw(full=False)

    def redraw(self, full: bool = True) -> None:
        """Render the panels from the state now (the timers call it; so do tests). The curve and
        the ranks table, the two big panels, follow at most every SLOW_RENDER_INTERVAL_S unless
        `full`: at 1000 records a second they were most of the control room's CPU, and a loss
        curve gains nothing from ten frames a second."""
        self._dirty = False
        now = self.clock()
        state = self.state
        if state is None or not self.is_running:
            return  # (a timer may still fire while the app shuts down and its widgets go)
        mono = time.monotonic()  # not `clock`: tests freeze that one
        slow = full or mono - self._slow_at >= SLOW_RENDER_INTERVAL_S
        if self._panels is None:
            self._panels = Panels.of(self)
        p = self._panels
        self.renders += 1
        # Views are computed under the lock (the reader folds records under it), set after it.
        with self.lock:
            header = figures.header_view(state, now, self.connected)
            trainer = figures.trainer_view(state, now)
            vram = figures.vram_view(state)
            cadence = figures.cadence_view(state, now)
            lr = figures.lr_view(state)
            host = figures.host_view(state)
            disk = figures.disk_view(state)
            findings = figures.findings_view(state)
            if slow:
                snapshot = self.series.snapshot() if self.series is not None else None
                loss, ranks = figures.loss_view(state, snapshot), figures.ranks_view(state)
            banner = self._banner_view(state, now)
            availability = tuple(self.can_act(a) for a in KEEPER_ACTIONS)
        p.header.view, p.trainer.view, p.vram.view, p.cadence.view = header, trainer, vram, cadence
        p.lr.view, p.host.view, p.disk.view, p.findings.view = lr, host, disk, findings
        if slow:
            self._slow_at = mono
            p.loss.view, p.ranks.view = loss, ranks
        p.log.view = self.log_lines or None
        p.banner.view = banner
        if availability != self._availability:
            self._availability = availability
            self.refresh_bindings()

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
        )

    # ------------------------------------------------------------------ which actions apply

    def can_act(self, action: str) -> bool:
        if self.current_action is not None or self.run_info is None:
            return False
        st = self.state
        if action == "resume":
            # the one key that still makes sense with the keeper gone (the banner names it)
            return st is not None and not figures.live_attempt(st)
        if not self.connected or st is None:
            return False
        if action in ("kill", "dump"):
            return figures.live_attempt(st)
        if action == "prune":
            return any(c.state != "pruned" for c in st.checkpoints)
        if action == "verify":
            return figures.has_checkpoints(st)
        return True

    def keeper_link(self) -> KeeperLink:
        if self.run_watch.link is not None:
            return self.run_watch.link
        if self.run_info is None:
            raise RunError("no run to act on")
        return self.source.connect(self.run_info)  # the keeper may be back; if not, this says so

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in KEEPER_ACTIONS:
            # Hidden when it cannot apply: at 80 columns the footer has room only for what does.
            return self.can_act(action)
        return True

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in BINDINGS:
            if b.action in KEEPER_ACTIONS and not self.can_act(b.action):
                continue
            if b.action == "quit":
                continue  # the built-in Quit command is already there
            key = b.key_display or b.key
            yield SystemCommand(
                f"{b.description.capitalize()} ({key})", b.tooltip, partial(self.run_action, b.action)
            )

    def action_help(self) -> None:
        self.push_screen(HelpScreen({a: self.can_act(a) for a in KEEPER_ACTIONS}))


def run_app(args: argparse.Namespace) -> int:
    """`trainroom [--theme NAME]`, `trainroom watch [RUN] [--theme NAME]` and `trainroom demo`
    (args: `run`, and `watch_theme` or `theme`): bad input is one line on stderr and exit 2."""
    run_id: str | None = getattr(args, "run", None)
    theme: str | None = getattr(args, "watch_theme", None) or getattr(args, "theme", None)
    if theme:
        loaded = theming.load_themes(theming.default_dirs())
        if loaded.find(theme) is None:
            print(
                f"trainroom: unknown theme {theme!r} (available: {', '.join(loaded.names())})",
                file=sys.stderr,
            )
            return 2
    if run_id:
        try:
            LocalRuns().resolve(run_id)
        except RunError as exc:
            print(f"trainroom: {exc}", file=sys.stderr)
            return 2
    if not sys.stdout.isatty():
        print(
            "trainroom: the control room needs a terminal (try `trainroom status`, or `--no-tui`)",
            file=sys.stderr,
        )
        return 2
    app = ControlRoom(run_id, theme)
    app.run()
    return app.return_code or 0
