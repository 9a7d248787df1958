"""The help screen: every key, what it does, and whether it applies right now."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.core.findings import ACTION_KEYS
from trainroom.tui.bindings import BINDINGS


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,question_mark,q",
            "close",
            "close",
            id="trainroom.help.close",
            tooltip="Back to the control room",
        ),
    ]

    def __init__(self, available: dict[str, bool]) -> None:
        super().__init__()
        self.available = available

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
        table.add_column("key", no_wrap=True)
        table.add_column("does")
        table.add_column("now", no_wrap=True)
        for b in BINDINGS:
            now = "" if self.available.get(b.action, True) else "not now"
            table.add_row(b.key_display or b.key, b.tooltip, now)
        table.add_row("ctrl+p", "Command palette: every action above, searchable", "")
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("trainroom keys", id="help-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(table, id="help-table")
            yield Label(
                f"Findings name the key of their suggested action, e.g. [{ACTION_KEYS['kill']}] kill.",
                classes="modal-hint",
                markup=False,
            )

    def action_close(self) -> None:
        self.dismiss(None)
