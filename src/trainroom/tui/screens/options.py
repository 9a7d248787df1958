"""The options screen (`O`, btop's): the refresh rate, the units bytes are written in and the
history graphs' style, each cycled by its key; Enter keeps them in control-room.json (the state
dir's control-room settings, beside the theme `t` chose), Esc leaves them as they were."""

from __future__ import annotations

from typing import ClassVar

import msgspec
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from trainroom.tui.theming import GRAPH_CHOICES, REFRESH_CHOICES, UNITS_CHOICES, RoomSettings


def _next(choices: tuple[object, ...], now: object) -> object:
    return choices[(choices.index(now) + 1) % len(choices)] if now in choices else choices[0]


class OptionsScreen(ModalScreen[RoomSettings | None]):
    """Dismissed with the settings to keep, or None (nothing changed)."""

    AUTO_FOCUS = None
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "cycle('refresh')", "refresh", id="trainroom.options.refresh", tooltip="Refresh rate"),
        Binding("u", "cycle('units')", "units", id="trainroom.options.units", tooltip="Units of bytes"),
        Binding("g", "cycle('graph')", "graph", id="trainroom.options.graph", tooltip="Graph style"),
        Binding("enter", "keep", "keep", id="trainroom.options.keep", tooltip="Keep these options"),
        Binding(
            "escape,q", "dismiss(None)", "cancel", id="trainroom.options.cancel", tooltip="Change nothing"
        ),
    ]

    def __init__(self, settings: RoomSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(id="options-box", classes="modal-box"):
            yield Label("Options", id="options-title")
            yield Label(self._text(), id="options-body")
            yield Label(
                "r / u / g: the next choice · enter: keep (control-room.json) · esc: change nothing",
                classes="modal-hint",
            )

    def _text(self) -> str:
        s = self.settings
        return (
            f"r  refresh rate   {s.refresh_s:g} s   (of {', '.join(f'{x:g}' for x in REFRESH_CHOICES)})\n"
            f"u  units          {s.units}   (binary: GiB, decimal: GB)\n"
            f"g  graph style    {s.graph}   (of {', '.join(GRAPH_CHOICES)})"
        )

    def action_cycle(self, what: str) -> None:
        s = self.settings
        if what == "refresh":
            i = REFRESH_CHOICES.index(s.refresh_s) + 1 if s.refresh_s in REFRESH_CHOICES else 0
            s = msgspec.structs.replace(s, refresh_s=REFRESH_CHOICES[i % len(REFRESH_CHOICES)])
        elif what == "units":
            s = msgspec.structs.replace(s, units=str(_next(UNITS_CHOICES, s.units)))
        else:
            s = msgspec.structs.replace(s, graph=str(_next(GRAPH_CHOICES, s.graph)))
        self.settings = s
        self.query_one("#options-body", Label).update(self._text())

    def action_keep(self) -> None:
        self.dismiss(self.settings)
