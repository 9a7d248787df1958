"""The result of an action: done or not, the keeper's message, and before -> after evidence."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.tui.evidence import before_after_lines, plan_lines


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

    def __init__(
        self,
        action: str,
        ok: bool,
        message: str,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.action_name, self.ok, self.message = action, ok, message
        self.before, self.after, self.details = before or {}, after or {}, details or {}

    def compose(self) -> ComposeResult:
        title = f"{self.action_name}: {'done' if self.ok else 'not done'}"
        with Vertical(id="result-box", classes="modal-box " + ("-ok" if self.ok else "-failed")):
            yield Label(title, id="result-title")
            yield Static(self.message or "(no message)", id="result-message", markup=False)
            with VerticalScroll(id="result-evidence"):
                if self.before or self.after:
                    yield Label("before -> after", classes="result-heading")
                    yield Static(
                        "\n".join(before_after_lines(self.before, self.after)),
                        id="result-before-after",
                        markup=False,
                    )
                if self.details:
                    yield Static("\n".join(plan_lines(self.details)), id="result-details", markup=False)
            yield Label("esc / enter: close", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)
