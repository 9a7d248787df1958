"""The command line (`:`, k9s's): a verb and its arguments, with completion (tab or → takes the
suggestion; the verbs that match are listed under the line), the breadcrumb of where it was opened
(runs › RUN › panel). Dismissed with the line typed, or None (Esc); the control room carries it
out exactly as the verb's key would (`cmdline.CommandLineKey`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label


class CommandLine(ModalScreen[str | None]):
    AUTO_FOCUS = "#cmd-input"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape", "dismiss(None)", "cancel", id="trainroom.cmd.cancel", tooltip="Close, doing nothing"
        ),
        Binding(
            "tab",
            "complete",
            "complete",
            id="trainroom.cmd.complete",
            tooltip="Take the suggestion",
            priority=True,
        ),
    ]

    def __init__(self, crumb: str, verbs: Sequence[str], suggestions: Sequence[str]) -> None:
        super().__init__()
        self.crumb = crumb
        self.verbs = list(verbs)
        self.suggestions = list(suggestions)

    def compose(self) -> ComposeResult:
        with Vertical(id="cmd-box"):
            yield Label(f"{self.crumb} · enter: run · tab: complete · esc: cancel", id="cmd-crumb")
            yield Input(
                placeholder="a command: kill, resume, prune keep 3, runs, job, theme NAME … (tab completes)",
                suggester=SuggestFromList(self.suggestions, case_sensitive=False),
                id="cmd-input",
            )
            yield Label(self._matches(""), id="cmd-matches")

    def _matches(self, typed: str) -> str:
        word = typed.strip().split(" ", 1)[0].lower()
        found = [v for v in self.verbs if v.startswith(word)] if word else self.verbs
        return (
            "  ".join(found) if found else f"no command starts with {word!r}"
        ) + "   · enter: run · esc: cancel"

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#cmd-matches", Label).update(self._matches(event.value))

    def action_complete(self) -> None:
        self.query_one(Input).action_cursor_right()

    def complete_on_tab(self) -> None:
        """The app's Tab (a priority binding: it comes first) completes here."""
        self.action_complete()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
