"""Finding the run the control room watches (or letting a person pick one), following its keeper,
reading its journal when the keeper is gone and looking for the keeper coming back."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from textual import on, work
from textual.worker import Worker, WorkerState

from trainroom.core.run import store as runs_store
from trainroom.core.run.gone import KeeperGone, keeper_gone
from trainroom.core.run.live import trainer_runs
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import LOG_NAME, RunError, RunInfo

from .messages import Attached, KeeperLost, LogTailChanged, RunChanged
from .overview import RunRow
from .reader import series_for
from .refresh import Refreshing
from .screens import lazy as screens  # each screen loads when first opened, after the first frame
from .widgets.banner import DisconnectBanner
from .widgets.header import RunHeader


class Following(Refreshing):
    """Finding the run and following it: its keeper while it lives, its journal when it is gone."""

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
