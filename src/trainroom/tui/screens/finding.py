"""One finding whole: what it says, since when, the others of its kind and what follows from it,
its evidence as a short table in human units, and its action with the target it acts on (or why
it cannot act now)."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from trainroom.tui import fmt
from trainroom.tui.evidence import hidden, value_text, words
from trainroom.tui.screens.confirm import SCROLL_BINDINGS
from trainroom.tui.screens.wrapped import WrappedLines
from trainroom.tui.verdict import SEVERITY_WORD, FindingRow


def evidence_table(evidence: tuple[tuple[str, object], ...]) -> Table:
    table = Table(box=None, padding=(0, 2, 0, 0), show_header=False)
    table.add_column("what", no_wrap=True, style="bold")
    table.add_column("value")
    keys = {key for key, _ in evidence}
    for key, value in evidence:
        # A death's evidence carries the signal twice (its number, and its name): one row says both.
        if not hidden(key) and not (key == "signal" and "exit_signal" in keys):
            # Cells as Text: a value is the trainer's text (a path with `[/]`), never markup.
            table.add_row(Text(words(key)), Text(value_text(key, value)))
    return table


class FindingDetail(ModalScreen[bool]):
    """Dismissed with True when the user asks for the finding's action."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,q", "close", "close", id="trainroom.finding.close", tooltip="Back to the control room"
        ),
        *SCROLL_BINDINGS,
    ]

    def __init__(self, row: FindingRow, now: float) -> None:
        super().__init__()
        self.row = row
        self.now = now

    def compose(self) -> ComposeResult:
        r = self.row
        with Vertical(id="finding-box", classes=f"modal-box -{r.level}"):
            yield Label(f"{SEVERITY_WORD.get(r.severity, r.severity.upper())} {r.code}", id="finding-title")
            with VerticalScroll(id="finding-body"):
                yield Static(WrappedLines([r.message]), id="finding-message")
                since = f"open since {fmt.clock(r.first_seen)} ({fmt.duration(self.now - r.first_seen)})"
                if r.last_seen and r.last_seen != r.first_seen:
                    since += f", last seen {fmt.clock(r.last_seen)}"
                yield Label(since, classes="modal-hint", markup=False)
                if r.repeats:
                    yield Label(f"the {r.count - 1} other(s) of its kind", classes="result-heading")
                    yield Static(WrappedLines(list(r.repeats)), id="finding-repeats")
                if r.follow:
                    yield Label("what follows from it", classes="result-heading")
                    follows = [line for k in r.follow for line in (k.since, *(f"  {m}" for m in k.messages))]
                    yield Static(WrappedLines(follows), id="finding-follow")
                if any(not hidden(k) for k, _ in r.evidence):
                    yield Label("evidence", classes="result-heading")
                    yield Static(evidence_table(r.evidence), id="finding-evidence")
                if r.fix:
                    yield Label("what to do", classes="result-heading")
                    said = f"[{r.key}] {r.fix}" if r.key else f"{r.fix}: not now, {r.why_not}"
                    yield Static(WrappedLines([said]), id="finding-fix")
            with Horizontal(classes="modal-buttons"):
                if r.key and r.fix:
                    yield Button(f"{r.fix} ({r.key})", variant="warning", id="finding-act")
                yield Button("close (esc)", variant="primary", id="finding-close")

    def on_mount(self) -> None:
        self.query_one("#finding-close", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "finding-act")

    def action_close(self) -> None:
        self.dismiss(False)

    def action_scroll_plan(self, lines: int) -> None:
        self.query_one("#finding-body", VerticalScroll).scroll_relative(y=lines, animate=False)
