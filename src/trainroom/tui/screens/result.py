"""The result of an action, in words: what became of it (done, refused, cancelled, done in
part: the CLI's words), the keeper's message, then what changed as before -> after in human
units when the action changed something, or what it found when it only read (a verify's
figures, a dump's stacks: each stack a block of its own, the box's whole width, labelled by
rank on a job of several); then what it acted on. Scrollable when long."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.core.actions import words
from trainroom.core.actions.render import confirmation
from trainroom.tui.evidence import ActionOutcome, before_after_rows, hidden, value_text
from trainroom.tui.evidence import words as field_words
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


def found_lines(after: Mapping[str, object]) -> list[str]:
    """A read-only result's figures, one a line in words (the text blocks left to their own)."""
    out = []
    for key, value in after.items():
        if hidden(key) or value is None or value in ([], {}) or key == "method":
            continue
        if words.is_block(value):
            continue
        out.append(f"{field_words(key)}: {value_text(key, value)}")
    return out


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
        o = outcome
        self.title_text = words.outcome(o.action, o.ok, o.message, dict(o.after))
        self.blocks = [] if o.before else words.blocks(dict(o.after))

    def compose(self) -> ComposeResult:
        o = self.outcome
        # A result that read something (stacks) takes the screen's width and height for it.
        classes = "modal-box " + ("-ok" if o.ok else "-failed") + (" -read" if self.blocks else "")
        with Vertical(id="result-box", classes=classes):
            yield Label(self.title_text, id="result-title", markup=False)
            yield Static(WrappedLines([o.message or "(no message)"]), id="result-message")
            with VerticalScroll(id="result-evidence"):
                if o.before:
                    rows = before_after_rows(o.before, o.after)
                    yield Label("before → after", classes="result-heading")
                    yield Static(before_after_table(rows), id="result-before-after")
                else:
                    found = found_lines(o.after)
                    if found:
                        yield Label("found", classes="result-heading")
                        yield Static(WrappedLines(found), id="result-found")
                for i, (heading, text) in enumerate(self.blocks):
                    yield Label(heading, classes="result-heading", markup=False)
                    yield Static(WrappedLines(text.rstrip("\n").splitlines()), id=f"result-block-{i}")
                if o.details:
                    _, details = confirmation(o.action, o.details, "")
                    if details:
                        yield Label("acted on", classes="result-heading")
                        yield Static(WrappedLines(details), id="result-details")
            yield Label("j/k: scroll · q / esc / enter: close", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll_plan(self, lines: int) -> None:
        self.query_one("#result-evidence", VerticalScroll).scroll_relative(y=lines, animate=False)
