"""The confirmation of a destructive action, in one fixed shape read at a glance: the question,
then one line saying what will happen to what and what is lost (the action's `headline`), then
the details in words and units (the action's own lines, the ones the CLI prints, less what the
headline said: `detail_lines`), then yes/no. What runs on yes is exactly this plan: the keeper refuses a target that changed since.

Cancel has the focus: a stray Enter never kills a process group. The details scroll (j/k, the
arrows, PgUp/PgDn) with the headline and the buttons always in view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from trainroom.core.actions.registry import REGISTRY
from trainroom.core.actions.render import confirmation
from trainroom.tui.screens.wrapped import WrappedLines

SCROLL_BINDINGS: list[BindingType] = [
    Binding("j,down", "scroll_plan(1)", "down", show=False, id="trainroom.modal.down"),
    Binding("k,up", "scroll_plan(-1)", "up", show=False, id="trainroom.modal.up"),
    Binding("pagedown", "scroll_plan(10)", "page down", show=False, id="trainroom.modal.page_down"),
    Binding("pageup", "scroll_plan(-10)", "page up", show=False, id="trainroom.modal.page_up"),
]


class ConfirmAction(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "yes", id="trainroom.confirm.yes", tooltip="Carry out the action"),
        Binding("n,escape,q", "cancel", "no", id="trainroom.confirm.no", tooltip="Leave everything as it is"),
        *SCROLL_BINDINGS,
    ]

    def __init__(
        self, action: str, plan: Mapping[str, object], message: str = "", question: str | None = None
    ) -> None:
        super().__init__()
        self.action_name = action
        self.plan = plan
        self.message = message
        known = REGISTRY.get(action)
        self.question = question or (known.spec.ask() if known is not None else f"{action.capitalize()}?")
        self.headline, self.lines = confirmation(action, plan, message)

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="modal-box"):
            yield Label(self.question, id="confirm-question", markup=False)
            yield Static(WrappedLines([self.headline or "(the keeper sent no plan)"]), id="confirm-headline")
            with VerticalScroll(id="confirm-plan"):
                yield Static(WrappedLines(self.lines or ["(no details)"]), id="confirm-details")
            with Horizontal(classes="modal-buttons"):
                yield Button(f"yes, {self.action_name} (y)", variant="error", id="confirm-yes")
                yield Button("cancel (n)", variant="primary", id="confirm-no")
            yield Label("y: yes · n / esc / q: no · j/k: scroll", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)

    def action_scroll_plan(self, lines: int) -> None:
        self.query_one("#confirm-plan", VerticalScroll).scroll_relative(y=lines, animate=False)
