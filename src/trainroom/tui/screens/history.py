"""The history screen (btop's graphs): the run's host RAM and page cache, VRAM (driver and
allocator), GPU utilisation, power and temperature, CPU, disk free and write rate over the last
5 min, the last hour or the whole run (`w`), from the journal's samples (`history.history_lines`).

It redraws at the refresh rate the options screen sets, and only when something it shows changed
(a new sample, the window, the size or an option): idle, it costs nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Label, Static

from trainroom.tui.history import WINDOWS, HistLine

# What the screen draws: (samples' version, the lines) for a window, a size and the options.
Lines = Callable[[int, int, int], tuple[int, tuple[HistLine, ...]]]
STYLES = {"title": "bold", "graph": "", "axis": "dim", "missing": "dim italic"}


class HistoryScreen(Screen[None]):
    AUTO_FOCUS = None
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,H", "back", "back", id="trainroom.history.back", tooltip="Back to the control room"),
        Binding(
            "w",
            "window",
            "window",
            id="trainroom.history.window",
            tooltip="The window: the last 5 min, the last hour, the whole run",
        ),
        Binding("q", "app.quit", "quit", id="trainroom.history.quit", tooltip="Close the control room"),
    ]

    def __init__(self, lines: Lines, refresh_s: Callable[[], float], crumb: str = "") -> None:
        super().__init__()
        self.lines_of = lines
        self.refresh_s = refresh_s
        self.crumb = crumb
        self.window = 0
        self._shown: tuple[object, ...] | None = None
        self.draws = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="history-box"):
            yield Label("", id="history-title")
            yield Static("", id="history-body")
            yield Label("w: window (5 min · 1 h · all) · O: options · esc: back", id="history-hint")

    def on_mount(self) -> None:
        self.redraw()
        self._arm()

    def _arm(self) -> None:
        self.set_timer(self.refresh_s(), self._tick)

    def _tick(self) -> None:
        if self.is_attached:
            self.redraw()
            self._arm()

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self, force: bool = False) -> None:
        body = self.query_one("#history-body", Static)
        cols, rows = max(body.size.width, 20), max(body.size.height, 4)
        version, lines = self.lines_of(self.window, cols, rows)
        key = (version, self.window, cols, rows, lines[:1])
        if key == self._shown and not force:
            return
        self._shown = key
        self.draws += 1
        text = Text(no_wrap=True, overflow="crop")
        for i, line in enumerate(lines[:rows]):
            if i:
                text.append("\n")
            text.append(line.text, style=STYLES.get(line.kind, ""))
        body.update(text)
        crumb = f"{self.crumb} › " if self.crumb else ""
        self.query_one("#history-title", Label).update(f"{crumb}history · {WINDOWS[self.window][0]}")

    def action_window(self) -> None:
        self.window = (self.window + 1) % len(WINDOWS)
        self.redraw(force=True)

    def action_back(self) -> None:
        self.dismiss(None)
