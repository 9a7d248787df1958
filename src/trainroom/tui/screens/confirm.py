"""The confirmation of a destructive action: the exact target from the keeper's plan, then yes/no.

Cancel has the focus: a stray Enter never kills a process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from trainroom.tui.evidence import plan_lines

QUESTIONS = {
    "kill": "Kill the trainer's process group?",
    "reclaim": "Reclaim the host page cache?",
    "prune": "Delete these checkpoints?",
    "resume": "Resume the run as a new attempt?",
}


class ConfirmAction(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "yes", id="trainroom.confirm.yes", tooltip="Carry out the action"),
        Binding("n,escape", "cancel", "no", id="trainroom.confirm.no", tooltip="Leave everything as it is"),
    ]

    def __init__(self, action: str, plan: Mapping[str, object], message: str = "") -> None:
        super().__init__()
        self.action_name = action
        self.plan = plan
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="modal-box"):
            yield Label(QUESTIONS.get(self.action_name, f"{self.action_name}?"), id="confirm-question")
            # The target first, then the keeper's words, scrolling together; the buttons stay in view.
            with VerticalScroll(id="confirm-plan"):
                yield Static("\n".join(plan_lines(self.plan)) or "(the keeper sent no details)", markup=False)
                if self.message:
                    yield Static(self.message, id="confirm-message", markup=False, classes="modal-hint")
            with Horizontal(classes="modal-buttons"):
                yield Button(f"yes, {self.action_name} (y)", variant="error", id="confirm-yes")
                yield Button("cancel (n)", variant="primary", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
