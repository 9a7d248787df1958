"""The control room: a pure client of a run's keeper.

Threads speak to the UI only through messages: the keeper reader and the log tail are plain
threads (no Textual in their modules) that post small messages; actions are thread workers that
post their replies back with `call_from_thread`. Records are folded into the run's state by the
reader under a lock; the app renders from that state at most ten times a second (a timer checks a
dirty flag), and once a second anyway so ages keep moving.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState, get_current_worker

from trainroom.core.protocol import Reply
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import LOG_NAME, RunError, RunInfo

from . import figures, theming
from .bindings import BINDINGS, DESTRUCTIVE, KEEPER_ACTIONS
from .link import KeeperLink, LocalRuns, RunSource
from .logtail import TrainerLogTail
from .messages import Attached, KeeperLost, LogTailChanged, RunChanged
from .reader import KeeperReader, series_for
from .screens.confirm import ConfirmAction
from .screens.help import HelpScreen
from .screens.picker import RunPicker
from .screens.result import ActionResult
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


class ControlRoom(App[int]):
    """`ControlRoom(run_id, theme)`: watch RUN (an id, a unique prefix, a run dir), or with no
    run the newest live one (a picker when several)."""

    CSS_PATH = "control_room.tcss"
    TITLE = "trainroom"
    BINDINGS: ClassVar[list[BindingType]] = list(BINDINGS)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]

    def __init__(
        self,
        run_id: str | None = None,
        theme: str | None = None,
        *,
        source: RunSource | None = None,
        clock: Callable[[], float] = time.time,
        theme_dirs: Iterable[Any] | None = None,
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
        self.connected = False
        self.gone_since: float | None = None
        self.gone_reason = ""
        self.log_lines: tuple[str, ...] = ()
        self.renders = 0
        self._dirty = False
        self._panels: tuple[Any, ...] | None = None
        self._slow_at = -1e9  # when the curve and the ranks table were last drawn (monotonic)
        self._reader: KeeperReader | None = None
        self._log_tail: TrainerLogTail | None = None
        self._link: KeeperLink | None = None
        self._action: str | None = None  # the action under way (plan, confirmation or execution)
        self._availability: tuple[bool, ...] = ()
        self._theme_note = ""
        self.theme_notice: str | None = None  # what was said about theme files, once
        self._said_no_runs = False
        for t in self.loaded_themes.themes:
            self.register_theme(t)
        self.theme = self._initial_theme(theme)

    # ------------------------------------------------------------------ themes

    def _initial_theme(self, requested: str | None) -> str:
        if requested:
            found = self.loaded_themes.find(requested) or (
                self.get_theme(requested) if requested in self.available_themes else None
            )
            if found is not None:
                return found.name
            self._theme_note = (
                f"unknown theme {requested!r}; available: {', '.join(self.loaded_themes.names())}"
            )
        preferred = theming.CONTRAST_THEME if self.no_color else theming.DEFAULT_THEME
        for name in (preferred, theming.DEFAULT_THEME):
            if self.loaded_themes.find(name) is not None:
                return name
        return "textual-dark"

    def get_theme_variable_defaults(self) -> dict[str, str]:
        """The app's own variables, derived from the current theme so that any theme (a
        built-in one picked in the palette too) draws the panels; theme files override them."""
        c = self.current_theme.to_color_system().generate()
        return {
            "trainroom-ok": c["text-success"],
            "trainroom-info": c["text-primary"],
            "trainroom-warn": c["text-warning"],
            "trainroom-crit": c["text-error"],
            "trainroom-dim": c["foreground-muted"],
            "trainroom-label": c["foreground-muted"],
            "trainroom-value": c["foreground"],
            "trainroom-border": c["foreground-disabled"],
            "trainroom-curve": c["text-primary"],
            "trainroom-lnv": c["text-warning"],
            "trainroom-mark": c["text-accent"],
            "trainroom-bar-driver": c["warning"],
            "trainroom-bar-allocator": c["primary"],
            "trainroom-bar-empty": c["surface-active"],
            "trainroom-badge-text": c["background"],
            "trainroom-state-running": c["success"],
            "trainroom-state-starting": c["primary"],
            "trainroom-state-slow": c["warning"],
            "trainroom-state-stalled": c["error"],
            "trainroom-state-hung": c["error"],
            "trainroom-state-dead": c["error"],
            "trainroom-state-exited": c["panel"],
            "trainroom-banner": c["error-muted"],
        }

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
        self._stop_threads()

    def _stop_threads(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        if self._log_tail is not None:
            self._log_tail.stop()
            self._log_tail = None

    # ------------------------------------------------------------------ finding the run

    @work(thread=True, exclusive=True, group="attach", exit_on_error=False)
    def _find_run(self) -> None:
        if self.run_id:
            info = self.source.resolve(self.run_id)
            self.call_from_thread(self._attach, info)
            return
        runs = self.source.list_runs()
        live = [r for r in runs if r.alive]
        if len(live) == 1:
            self.call_from_thread(self._attach, live[0])
        elif len(live) > 1:
            self.call_from_thread(self.push_screen, RunPicker(live), self._picked)
        elif runs:
            self.call_from_thread(self._attach, max(runs, key=lambda r: r.created))
        else:
            self.call_from_thread(self._no_runs)

    def _picked(self, info: RunInfo | None) -> None:
        if info is None:
            self.exit(0)
        else:
            self._attach(info)

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

    def _attach(self, info: RunInfo) -> None:
        """Watch `info`: its keeper when alive, else the journal's last state."""
        self.run_info = info
        self.run_id = info.run_id
        self.sub_title = info.run_id
        if self._log_tail is None:
            self._log_tail = TrainerLogTail(
                Path(info.run_dir) / LOG_NAME, lambda lines: self.post_message(LogTailChanged(lines))
            )
            self._log_tail.start()
        if not info.alive:
            self._keeper_gone("the keeper is not running", self.clock())
            return
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        try:
            self._link = self.source.connect(info)
        except Exception as exc:  # a socket that vanished between the listing and now
            self._keeper_gone(str(exc) or type(exc).__name__, self.clock())
            return
        reader: KeeperReader | None = None

        # Messages name their reader: one stopped meanwhile (a reconnect) is not listened to.
        def on_snapshot(st: RunState, series: Series) -> None:
            self.post_message(Attached(st, series, reader))

        reader = KeeperReader(
            self._link,
            self.lock,
            on_snapshot=on_snapshot,
            on_change=lambda: self.post_message(RunChanged()),
            on_gone=lambda reason, t: self.post_message(KeeperLost(reason, t, reader)),
            clock=self.clock,
        )
        self._reader = reader
        reader.start()

    def on_attached(self, message: Attached) -> None:
        if message.reader is not self._reader:
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
        if message.reader is self._reader:
            self._keeper_gone(message.reason, message.t)

    def _keeper_gone(self, reason: str, t: float) -> None:
        self.connected = False
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        self._link = None
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
            info = self.source.resolve(self.run_id)
        except (RunError, OSError):
            info = None
        if info is not None and info.alive:
            self.call_from_thread(self._attach, info)
        else:
            self.call_from_thread(self.set_timer, self.reconnect_interval_s, self._look_for_keeper)

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
        with self.lock:
            fast = (
                figures.header_view(state, now, self.connected),
                figures.trainer_view(state, now),
                figures.vram_view(state),
                figures.cadence_view(state, now),
                figures.lr_view(state),
                figures.host_view(state),
                figures.disk_view(state),
                figures.findings_view(state),
            )
            if slow:
                snapshot = self.series.snapshot() if self.series is not None else None
                loss_view, ranks_view = figures.loss_view(state, snapshot), figures.ranks_view(state)
            banner = self._banner_view(state, now)
            availability = tuple(self._can(a) for a in KEEPER_ACTIONS)
        self.renders += 1
        if self._panels is None:
            # Found once: a DOM query per panel per render is a real share of the TUI's CPU.
            q = self.query_one
            self._panels = (
                q(RunHeader),
                q(TrainerPanel),
                q(VramPanel),
                q(CadencePanel),
                q(LrPanel),
                q(HostPanel),
                q(DiskPanel),
                q(FindingsPanel),
                q(LossPanel),
                q(RanksPanel),
                q(LogTailPanel),
                q(DisconnectBanner),
            )
        for panel, view in zip(self._panels[: len(fast)], fast, strict=True):
            panel.view = view
        loss, ranks, log, banner_panel = self._panels[len(fast) :]
        if slow:
            self._slow_at = mono
            loss.view = loss_view
            ranks.view = ranks_view
        log.view = self.log_lines or None
        banner_panel.view = banner
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

    def _can(self, action: str) -> bool:
        if self._action is not None or self.run_info is None:
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in KEEPER_ACTIONS:
            # Hidden when it cannot apply: at 80 columns the footer has room only for what does.
            return self._can(action)
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for b in BINDINGS:
            if b.action in KEEPER_ACTIONS and not self._can(b.action):
                continue
            if b.action == "quit":
                continue  # the built-in Quit command is already there
            key = b.key_display or b.key
            yield SystemCommand(
                f"{b.description.capitalize()} ({key})", b.tooltip, partial(self.run_action, b.action)
            )

    def action_help(self) -> None:
        self.push_screen(HelpScreen({a: self._can(a) for a in KEEPER_ACTIONS}))

    # ------------------------------------------------------------------ actions

    def action_kill(self) -> None:
        self._start_action("kill")

    def action_reclaim(self) -> None:
        self._start_action("reclaim")

    def action_prune(self) -> None:
        self._start_action("prune")

    def action_resume(self) -> None:
        self._start_action("resume")

    def action_dump(self) -> None:
        self._start_action("dump")

    def action_verify(self) -> None:
        self._start_action("verify")

    def action_bench(self) -> None:
        self._start_action("bench")

    def _start_action(self, action: str) -> None:
        if not self._can(action):
            self.notify(f"{action} does not apply now", severity="warning", timeout=3)
            return
        self._action = action
        self._progress(f"{action}: asking the keeper for the plan…")
        self.refresh_bindings()
        self._request_plan(action)

    def _action_link(self) -> KeeperLink:
        if self._link is not None:
            return self._link
        if self.run_info is None:
            raise RunError("no run to act on")
        return self.source.connect(self.run_info)  # the keeper may be back; if not, this says so

    def _replies(self, action: str, args: dict[str, Any], confirm: bool) -> Iterator[Reply]:
        """The keeper's replies to one request, read by a daemon thread: the worker waits on them
        but gives up when cancelled, so quitting never waits for an action (the keeper carries
        it out whether anyone watches or not)."""
        replies: queue.Queue[Reply | BaseException | None] = queue.Queue()
        link = self._action_link()

        def pump() -> None:
            try:
                for reply in link.request(action, args, confirm):
                    replies.put(reply)
                replies.put(None)
            except BaseException as exc:  # handed to the worker, which raises it
                replies.put(exc)

        threading.Thread(target=pump, name=f"trainroom-{action}", daemon=True).start()
        worker = get_current_worker()
        while True:
            try:
                item = replies.get(timeout=0.2)
            except queue.Empty:
                if worker.is_cancelled:
                    return
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    @work(thread=True, exclusive=True, group="action", exit_on_error=False)
    def _request_plan(self, action: str) -> None:
        replies = list(self._replies(action, {}, False))
        if not get_current_worker().is_cancelled:
            self.call_from_thread(self._plan_arrived, action, replies)

    def _plan_arrived(self, action: str, replies: list[Reply]) -> None:
        plan = next((r for r in replies if r.stage == "plan"), None)
        done = next((r for r in replies if r.stage == "done"), None)
        if plan is None or not plan.ok:
            # Refused or not available yet: say it plainly, as the keeper put it.
            r = done or plan
            self._finish(
                action,
                False,
                r.message if r else "the keeper sent no plan",
                r.before if r else {},
                r.after if r else {},
                r.plan if r else {},
            )
            return
        if action in DESTRUCTIVE:
            self._progress(f"{action}: waiting for your confirmation")
            self.push_screen(
                ConfirmAction(action, plan.plan, plan.message), partial(self._confirmed, action, plan)
            )
        else:
            self._execute(action, plan.plan)

    def _confirmed(self, action: str, plan: Reply, yes: bool | None) -> None:
        if yes:
            self._execute(action, plan.plan)
        else:
            self._action = None
            self._progress(None)
            self.refresh_bindings()
            self.notify(f"{action}: cancelled, nothing done", timeout=3)

    @work(thread=True, exclusive=True, group="action", exit_on_error=False)
    def _execute(self, action: str, plan: dict[str, Any]) -> None:
        self.call_from_thread(self._progress, f"{action}: running…")
        final: Reply | None = None
        # `expect` is the target the user confirmed: the keeper refuses if it changed meanwhile.
        for reply in self._replies(action, {"expect": plan}, True):
            if reply.stage == "done":
                final = reply
            else:
                self.call_from_thread(self._progress, f"{action}: {reply.message}")
        if get_current_worker().is_cancelled:
            return
        if final is None:
            self.call_from_thread(
                self._finish, action, False, "the keeper ended the request without a result", {}, {}, {}
            )
        else:
            self.call_from_thread(
                self._finish, action, final.ok, final.message, final.before, final.after, final.plan
            )

    def _progress(self, line: str | None) -> None:
        if self.is_running:
            self.query_one(ActionStrip).view = line

    def _finish(
        self,
        action: str,
        ok: bool,
        message: str,
        before: dict[str, Any],
        after: dict[str, Any],
        details: dict[str, Any],
    ) -> None:
        self._action = None
        self._progress(None)
        self.refresh_bindings()
        self.push_screen(ActionResult(action, ok, message, before, after, details))

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        """Every worker's failure lands here, once (harlequin's way)."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        text = str(error) or type(error).__name__
        group = event.worker.group
        if group == "action" and self._action is not None:
            self._finish(self._action, False, f"the keeper could not be reached: {text}", {}, {}, {})
        elif group == "attach":
            self.notify(text, title="cannot watch that run", severity="error", timeout=30)
        elif group == "journal":
            self.notify(f"journal unreadable: {text}", severity="error", timeout=10)
            if self.run_id is not None:
                self.set_timer(self.reconnect_interval_s, self._look_for_keeper)
        elif group == "reconnect":
            self.set_timer(self.reconnect_interval_s, self._look_for_keeper)


def themes_for_cli() -> theming.LoadedThemes:
    return theming.load_themes(theming.default_dirs())


def run_app(args: argparse.Namespace) -> int:
    """`trainroom [--theme NAME]`, `trainroom watch [RUN] [--theme NAME]` and `trainroom demo`
    (args: `run`, and `watch_theme` or `theme`): bad input is one line on stderr and exit 2."""
    run_id: str | None = getattr(args, "run", None)
    theme: str | None = getattr(args, "watch_theme", None) or getattr(args, "theme", None)
    if theme:
        loaded = themes_for_cli()
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
