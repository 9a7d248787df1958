"""The history key (`H`: btop's graphs of the run's life) and the options key (`O`: refresh rate,
units, graph style, kept in control-room.json). A mixin, so the app stays the size it is: the
screens read the samples the reader folds (under its lock) and the options the person chose."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from textual.app import App

from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from .screens import lazy as screens
from .theming import RoomSettings, keep_settings, room_settings

if TYPE_CHECKING:  # the graphs and their screens load when first opened, not before the first frame
    from .history import HistLine


class HistoryKeys:
    """Mixed into the control room (an `App`)."""

    lock: threading.Lock
    state: RunState | None
    series: Series | None
    run_info: RunInfo | None
    routine_interval_s: float
    _room_options: RoomSettings | None = None

    @property
    def room_options(self) -> RoomSettings:
        if self._room_options is None:
            self._room_options = room_settings()
        return self._room_options

    def on_mount(self) -> None:
        """A refresh rate kept from an earlier session applies from the start (Textual calls
        every class's on_mount along the MRO; the app's own runs too)."""
        chosen = self.room_options.refresh_s
        if chosen != RoomSettings().refresh_s:
            self.routine_interval_s = chosen

    def action_history(self) -> None:
        assert isinstance(self, App)
        run = self.run_info.run_id if self.run_info is not None else "no run"
        self.push_screen(
            screens.history()(self.history_now, lambda: self.room_options.refresh_s, f"runs › {run}")
        )

    def history_now(self, window: int, cols: int, rows: int) -> tuple[int, tuple[HistLine, ...]]:
        with self.lock:
            vitals = self.series.vitals if self.series is not None else None
            samples = list(vitals.samples) if vitals is not None else []
            version = vitals.version if vitals is not None else 0
            gpu = self.state.probe.gpu if self.state is not None and self.state.probe is not None else None
        note = gpu.reason if gpu is not None and not gpu.available else None
        o = self.room_options
        from .history import history_lines

        lines = history_lines(samples, window, cols, rows, units=o.units, style=o.graph, gpu_note=note)
        return version, lines

    def action_options(self) -> None:
        assert isinstance(self, App)
        from .screens.options import OptionsScreen

        self.push_screen(OptionsScreen(self.room_options), self._options_chosen)

    def _options_chosen(self, chosen: RoomSettings | None) -> None:
        assert isinstance(self, App)
        if chosen is None:
            return
        self._room_options = chosen
        self.routine_interval_s = chosen.refresh_s
        said = keep_settings(chosen)
        self.notify(
            f"options: refresh {chosen.refresh_s:g} s, {chosen.units} units, {chosen.graph} graphs"
            + (f" ({said})" if said else " (kept in control-room.json)"),
            timeout=3,
        )
        for screen in self.screen_stack:
            if isinstance(screen, screens.history()):
                screen.redraw(force=True)
