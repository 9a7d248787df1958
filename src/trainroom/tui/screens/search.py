"""The `/` prompt: what to look for in the trainer log."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class SearchPrompt(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="trainroom.search.cancel", tooltip="Search nothing"),
    ]

    def __init__(self, last: str = "") -> None:
        super().__init__()
        self.last = last

    def compose(self) -> ComposeResult:
        with Vertical(id="search-box", classes="modal-box"):
            yield Label("search the trainer log (newest match first; n older, N newer)", id="search-title")
            yield Input(value=self.last, placeholder="text, any case", id="search-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
