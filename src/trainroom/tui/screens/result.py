"""The result of an action: done or not, the keeper's message, and before -> after evidence."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.tui.evidence import ActionOutcome, before_after_lines, plan_lines


class ActionResult(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,enter,q,space",
            "close",
            "close",
            id="trainroom.result.close",
            tooltip="Back to the control room",
        ),
    ]

    def __init__(self, outcome: ActionOutcome) -> None:
        super().__init__()
        self.outcome = outcome

    def compose(self) -> ComposeResult:
        o = self.outcome
        title = f"{o.action}: {'done' if o.ok else 'not done'}"
        with Vertical(id="result-box", classes="modal-box " + ("-ok" if o.ok else "-failed")):
            yield Label(title, id="result-title")
            yield Static(o.message or "(no message)", id="result-message", markup=False)
            with VerticalScroll(id="result-evidence"):
                if o.before or o.after:
                    yield Label("before -> after", classes="result-heading")
                    yield Static(
                        "\n".join(before_after_lines(o.before, o.after)),
                        id="result-before-after",
                        markup=False,
                    )
                if o.details:
                    yield Static("\n".join(plan_lines(o.details)), id="result-details", markup=False)
            yield Label("esc / enter: close", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)
