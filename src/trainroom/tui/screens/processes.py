"""The processes screen (nvitop's process table): every process of the live attempt as a tree,
with its CPU %, RSS, GPU memory and utilisation, state, elapsed time and full command (the table
scrolls sideways: ←/→ or h/l); sorted by a key of the person's choice; the row under the cursor
gets a signal of their choice (^k or K: TERM, INT, KILL, USR1, STOP, CONT), through the keeper's
plan and the same confirmation as every kill.

The rows come from the keeper's probe (`proctable.procs_view`), read once a second."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Label, OptionList
from textual.widgets.option_list import Option

from trainroom.core.ops.signal_one import SIGNALS
from trainroom.tui.proctable import COLUMNS, SORT_COLUMN, SORT_KEYS, ProcLine, ProcsView

REFRESH_S = 1.0
SIGNAL_HELP = {
    "TERM": "ask it to end (it may save first)",
    "INT": "as ^C: ask it to end",
    "KILL": "end it now, no chance to save",
    "USR1": "the program's own (often: dump stacks)",
    "STOP": "freeze it until CONT (its peers wait)",
    "CONT": "let a stopped process run again",
}
HINT = "j/k: move · ←/→: scroll · s/S: sort / reverse · ^k or K: signal the process · esc: back"


class SignalPicker(ModalScreen[str | None]):
    """Which signal for one process: dismissed with its name (TERM, …) or None."""

    AUTO_FOCUS = "#signal-list"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss(None)", "cancel", id="trainroom.signal.cancel", tooltip="Send nothing"),
    ]

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def compose(self) -> ComposeResult:
        with Vertical(id="signal-box", classes="modal-box"):
            yield Label(f"Signal {self.label}:", id="signal-title")
            yield OptionList(
                *(Option(f"SIG{name:<5} {SIGNAL_HELP[name]}", id=name) for name in SIGNALS),
                id="signal-list",
            )
            yield Label(
                "enter: choose (the plan and a confirmation follow) · esc: cancel", classes="modal-hint"
            )

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


class ProcessesScreen(Screen[None]):
    """`view(sort, reverse)` gives the rows now; `signal(line, name)` starts the kill flow."""

    AUTO_FOCUS = "#procs-table"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,p", "back", "back", id="trainroom.procs.back", tooltip="Back to the control room"),
        Binding("j", "move(1)", "down", show=False, id="trainroom.procs.down", tooltip="The next process"),
        Binding("k", "move(-1)", "up", show=False, id="trainroom.procs.up", tooltip="The process above"),
        Binding("h", "scroll(-8)", "left", show=False, id="trainroom.procs.left", tooltip="Scroll left"),
        Binding("l", "scroll(8)", "right", show=False, id="trainroom.procs.right", tooltip="Scroll right"),
        Binding("s", "sort", "sort", id="trainroom.procs.sort", tooltip="Sort by the next key"),
        Binding("S", "reverse", "reverse", id="trainroom.procs.reverse", tooltip="Reverse the order"),
        Binding(
            "ctrl+k,K",
            "signal",
            "signal",
            id="trainroom.procs.signal",
            tooltip="Send a signal of your choice to the process under the cursor (asks first)",
        ),
        Binding("q", "app.quit", "quit", id="trainroom.procs.quit", tooltip="Close the control room"),
    ]

    def __init__(
        self,
        view: Callable[[str, bool], ProcsView],
        signal: Callable[[ProcLine, str], None],
        crumb: str = "",
    ) -> None:
        super().__init__()
        self.view_of = view
        self.signal_to = signal
        self.crumb = crumb
        self.sort_by = "tree"
        self.reverse = False
        self.view: ProcsView | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="procs-box"):
            yield Label("", id="procs-title")
            yield Label("", id="procs-note", classes="modal-hint")
            yield DataTable(id="procs-table", cursor_type="row", zebra_stripes=False)
            yield Label(HINT, id="procs-hint", classes="modal-hint")

    def on_mount(self) -> None:
        self.refresh_rows(force=True)
        self.set_interval(REFRESH_S, self.refresh_rows)
        self.query_one(DataTable).focus()

    def refresh_rows(self, force: bool = False) -> None:
        view = self.view_of(self.sort_by, self.reverse)
        if view == self.view and not force:
            return
        self.view = view
        table = self.query_one(DataTable)
        keep = self.selected()
        x = table.scroll_x
        table.clear(columns=True)
        sorted_col = SORT_COLUMN.get(self.sort_by)
        for c in COLUMNS:
            mark = (" ▲" if self.reverse else " ▼") if c == sorted_col else ""
            table.add_column(Text(c + mark, style="bold" if mark else ""), key=c)
        for line in view.lines:
            cells = [Text(v, justify="right") for v in line.cells[:-1]]
            table.add_row(*cells, Text(line.cells[-1]), key=str(line.pid))
        pids = [line.pid for line in view.lines]
        if keep is not None and keep.pid in pids:
            table.move_cursor(row=pids.index(keep.pid))
        table.scroll_x = x
        crumb = f"{self.crumb} › " if self.crumb else ""
        order = f" · sorted by {self.sort_by}{' (reversed)' if self.reverse else ''}"
        self.query_one("#procs-title", Label).update(f"{crumb}{view.title}{order}")
        note = self.query_one("#procs-note", Label)
        note.update(view.note or "")
        note.display = view.note is not None

    def selected(self) -> ProcLine | None:
        table = self.query_one(DataTable)
        if self.view is None or table.row_count == 0:
            return None
        row = table.cursor_row
        return self.view.lines[row] if 0 <= row < len(self.view.lines) else None

    def action_move(self, by: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=max(0, min(table.cursor_row + by, table.row_count - 1)))

    def action_scroll(self, by: int) -> None:
        table = self.query_one(DataTable)
        table.scroll_to(x=max(table.scroll_x + by, 0), animate=False)

    def action_sort(self) -> None:
        self.sort_by = SORT_KEYS[(SORT_KEYS.index(self.sort_by) + 1) % len(SORT_KEYS)]
        self.refresh_rows(force=True)

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self.refresh_rows(force=True)

    def action_back(self) -> None:
        self.dismiss(None)

    def action_signal(self) -> None:
        line = self.selected()
        if line is None:
            self.notify("signal: no process to signal here", severity="warning", timeout=3)
            return

        def chosen(name: str | None) -> None:
            if name:
                self.signal_to(line, name)

        self.app.push_screen(SignalPicker(line.label), chosen)
