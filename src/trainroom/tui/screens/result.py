"""The result of an action: done or not, the keeper's message, before -> after as a short table
in human units, and what it acted on; scrollable when long."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.tui.evidence import ActionOutcome, before_after_rows, plan_lines
from trainroom.tui.screens.confirm import SCROLL_BINDINGS
from trainroom.tui.screens.wrapped import WrappedLines


def before_after_table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table(box=None, padding=(0, 2, 0, 0), show_header=True, header_style="bold")
    table.add_column("", no_wrap=True)
    table.add_column("before", justify="right")
    table.add_column("→", no_wrap=True)
    table.add_column("after", justify="right")
    for what, before, after in rows:
        # Cells as Text: the values come from the run (paths, messages), never markup.
        table.add_row(Text(what), Text(before), "→", Text(after), style="dim" if before == after else "")
    return table


class ActionResult(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,enter,q,space",
            "close",
            "close",
            id="trainroom.result.close",
            tooltip="Back to the control room",
        ),
        *SCROLL_BINDINGS,
    ]

    def __init__(self, outcome: ActionOutcome) -> None:
        super().__init__()
        self.outcome = outcome

    def compose(self) -> ComposeResult:
        o = self.outcome
        title = f"{o.action}: {'done' if o.ok else 'not done'}"
        with Vertical(id="result-box", classes="modal-box " + ("-ok" if o.ok else "-failed")):
            yield Label(title, id="result-title")
            with VerticalScroll(id="result-evidence"):
                yield Static(WrappedLines([o.message or "(no message)"]), id="result-message")
                rows = before_after_rows(o.before, o.after)
                if rows:
                    yield Label("before → after", classes="result-heading")
                    yield Static(before_after_table(rows), id="result-before-after")
                details = plan_lines(o.details)
                if details:
                    yield Label("acted on", classes="result-heading")
                    yield Static(WrappedLines(details), id="result-details")
            yield Label("esc / enter: close", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll_plan(self, lines: int) -> None:
        self.query_one("#result-evidence", VerticalScroll).scroll_relative(y=lines, animate=False)
