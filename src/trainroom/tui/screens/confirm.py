"""The confirmation of a destructive action, in one fixed shape read at a glance: the question,
then one line saying what will happen to what and what is lost (the action's `headline`), then
the details in words and units (the action's own lines, the ones the CLI prints, less what the
headline said: `detail_lines`), then yes/no. What runs on yes is exactly this plan: the keeper refuses a target that changed since.

Cancel has the focus: a stray Enter never kills a process group. The details scroll (j/k, the
arrows, PgUp/PgDn) with the headline and the buttons always in view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from trainroom.core.actions.registry import REGISTRY
from trainroom.tui.evidence import plan_lines as generic_lines
from trainroom.tui.screens.wrapped import WrappedLines

QUESTIONS = {
    "kill": "Kill the trainer's process group?",
    "reclaim": "Reclaim the host page cache?",
    "prune": "Delete these checkpoints?",
    "resume": "Resume the run as a new attempt?",
    "continue": "Continue the trainer's stopped processes?",
}

SCROLL_BINDINGS: list[BindingType] = [
    Binding("j,down", "scroll_plan(1)", "down", show=False, id="trainroom.modal.down"),
    Binding("k,up", "scroll_plan(-1)", "up", show=False, id="trainroom.modal.up"),
    Binding("pagedown", "scroll_plan(10)", "page down", show=False, id="trainroom.modal.page_down"),
    Binding("pageup", "scroll_plan(-10)", "page up", show=False, id="trainroom.modal.page_up"),
]


def confirmation(action: str, plan: Mapping[str, object], summary: str) -> tuple[str, list[str]]:
    """(headline, detail lines) of a plan, as the action words them; a plan no action words (an
    action this control room does not know) as its fields in words under the keeper's summary."""
    known = REGISTRY.get(action)
    shown: dict[str, Any] = dict(plan)
    if known is None:
        return summary, generic_lines(plan)
    try:
        lines = known.detail_lines(shown)
        head = known.headline(shown, summary)
    except (TypeError, ValueError, AttributeError):
        # A plan of another shape (an older keeper's): its fields in words, never a traceback.
        return summary, generic_lines(plan)
    # The details one step in from the headline: the actions indent them for the CLI.
    return head or summary, [line[2:] if line.startswith("  ") else line for line in lines]


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
        self.question = question or QUESTIONS.get(action, f"{action.capitalize()}?")
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
