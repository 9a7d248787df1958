"""The runs overview (k9s-like): every run under the state dir in one line each, sortable;
Enter opens one in the control room, Esc goes back to the run watched before.

k9s habits: j/k move the cursor, g/G go to the first / last row, `/` filters (what is typed is
looked for in each row's name, state, worst finding and command; Enter keeps it, Esc drops it);
the column the rows are sorted by carries an arrow in its header."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label

from trainroom.tui import fmt
from trainroom.tui.overview import SORT_ORDER, SORTS, RunRow, matches, ordered
from trainroom.tui.verdict import SEVERITY_LEVEL

COLUMNS = ("run", "state", "step", "loss", "steps/s", "worst", "age", "command")
# Under 120 columns the worst finding comes right after the state, so 80 columns still show it
# (the rest scrolls sideways).
NARROW_COLUMNS = ("run", "state", "worst", "step", "steps/s", "loss", "age", "command")
NARROW_BELOW = 120


def rate_cell(rate: float | None, source: str | None) -> str:
    """steps/s in the overview: "≈" before one read from when the log's lines were read (an
    estimate: the trainer's own timing is not in its lines), the figure alone otherwise."""
    if not rate:
        return "—"
    return ("≈" if source == "read times" else "") + fmt.rate(rate, "")


class RunsScreen(Screen[str | None]):
    """Dismissed with the run id to open, or None (back, or no run picked)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,o", "back", "back", id="trainroom.runs.back", tooltip="Back to the run watched before"
        ),
        Binding("j", "move(1)", "down", show=False, id="trainroom.runs.down", tooltip="The next run"),
        Binding("k", "move(-1)", "up", show=False, id="trainroom.runs.up", tooltip="The run above"),
        Binding("g", "edge(0)", "top", show=False, id="trainroom.runs.top", tooltip="The first run"),
        Binding("G", "edge(-1)", "bottom", show=False, id="trainroom.runs.bottom", tooltip="The last run"),
        Binding(
            "slash", "filter", "filter", id="trainroom.runs.filter", tooltip="Show only the runs that match"
        ),
        Binding("s", "sort", "sort", id="trainroom.runs.sort", tooltip="Sort by the next column"),
        Binding("S", "reverse", "reverse", id="trainroom.runs.reverse", tooltip="Reverse the order"),
        Binding("q", "app.quit", "quit", id="trainroom.runs.quit", tooltip="Close the control room"),
    ]

    def __init__(self, rows: list[RunRow], now: float, current: str | None, title: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.now = now
        self.current = current
        self.title_text = title
        self.sort_by = "age"
        self.reverse = False
        self.filter = ""
        self._style: dict[str, Style] = {}
        self._ready = False  # the table has its columns (rows that come before wait for them)
        self._drawn_columns: tuple[str, ...] = ()

    def compose(self) -> ComposeResult:
        with Vertical(id="runs-box"):
            yield Label(self._title(), id="runs-title")
            yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=False)
            yield Input(placeholder="filter: part of a run, a state, a finding, a command", id="runs-filter")
            yield Label(
                "enter: open · j/k g/G: move · /: filter · s: sort by the next column · S: reverse · "
                "esc: back · q: quit",
                id="runs-hint",
                classes="modal-hint",
            )

    def on_mount(self) -> None:
        # The table draws its cells itself: the theme's colours, read once.
        css = self.app.get_css_variables()
        self._style = {
            level: Style.parse(("bold " if level in ("crit", "warn") else "") + css[f"trainroom-{level}"])
            for level in ("ok", "info", "warn", "crit", "dim")
            if f"trainroom-{level}" in css
        }
        box = self.query_one("#runs-filter", Input)
        box.value = self.filter  # a filter kept from the last opening
        box.display = bool(self.filter)
        self._ready = True
        self._fill()
        self.query_one(DataTable).focus()

    def _title(self) -> str:
        live = sum(1 for r in self.rows if r.training)
        base = self.title_text or f"runs: {len(self.rows)}, {live} live"
        shown = self.shown()
        if self.filter:
            base += f" · {len(shown)} match {self.filter!r} (esc: all)"
        if any(r.rate_from == "read times" and r.steps_per_s for r in shown):
            base += " · ≈ steps/s: when its log lines were read"
        return base

    def shown(self) -> list[RunRow]:
        """The rows the table holds: those matching the filter, in the chosen order."""
        return ordered([r for r in self.rows if matches(r, self.filter)], self.sort_by, self.reverse)

    def update_rows(self, rows: list[RunRow], now: float) -> None:
        self.rows, self.now = rows, now
        if self._ready:  # else on_mount fills the table once it has its columns
            self._fill()

    def _header(self, column: str) -> Text:
        """A column's header; the sorted one with an arrow for the way its rows go."""
        if column != self.sort_by:
            return Text(column)
        descending = SORTS[column][1] != self.reverse
        return Text(f"{column} {'▼' if descending else '▲'}", style="bold")

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        keep = self._cursor_run()
        # The columns again with the rows: the header says the order the rows are in.
        table.clear(columns=True)
        columns = self.columns()
        for c in columns:
            table.add_column(self._header(c), key=c)
        rows = self.shown()
        for r in rows:
            cells = dict(zip(COLUMNS, self._cells(r), strict=True))
            table.add_row(*(cells[c] for c in columns), key=r.run_id)
        ids = {r.run_id for r in rows}
        if keep is not None and keep in ids:
            table.move_cursor(row=table.get_row_index(keep))
        elif self.current is not None and self.current in ids:
            table.move_cursor(row=table.get_row_index(self.current))
        self.query_one("#runs-title", Label).update(self._title())
        self._drawn_columns = columns

    def columns(self) -> tuple[str, ...]:
        return NARROW_COLUMNS if 0 < self.size.width < NARROW_BELOW else COLUMNS

    def on_resize(self) -> None:
        if self._ready and self._drawn_columns != self.columns():
            self._fill()

    def _cursor_run(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None

    def _cells(self, r: RunRow) -> list[Text]:
        level = r.level
        state = (
            r.state.upper() + (" · attached" if r.attached else "") + ("" if r.keeper else " · keeper gone")
        )
        worst = Text(
            f"{r.worst_code}" + (f" +{r.findings - 1}" if r.findings > 1 else "") if r.worst_code else "—"
        )
        if r.worst_severity:
            worst.stylize(self._style.get(SEVERITY_LEVEL.get(r.worst_severity, "info"), ""))
        marker = "▶ " if r.run_id == self.current else "  "
        return [
            Text(marker + r.name),
            Text(state, style=self._style.get(level, "")),
            Text(str(r.step) if r.step is not None else "—", justify="right"),
            Text(fmt.loss(r.loss), justify="right"),
            Text(rate_cell(r.steps_per_s, r.rate_from), justify="right"),
            worst,
            Text(fmt.duration(max(self.now - r.created, 0.0)), justify="right"),
            Text(fmt.shorten(r.error or r.command, 80), style="dim"),
        ]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_move(self, by: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=max(0, min(table.cursor_row + by, table.row_count - 1)))

    def action_edge(self, end: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=0 if end == 0 else table.row_count - 1)

    def action_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter = event.value.strip()
        self._fill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        # Enter keeps the filter and gives the table the keys back.
        event.input.display = bool(self.filter)
        self.query_one(DataTable).focus()

    def action_sort(self) -> None:
        i = SORT_ORDER.index(self.sort_by)
        self.sort_by = SORT_ORDER[(i + 1) % len(SORT_ORDER)]
        self._fill()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._fill()

    def action_back(self) -> None:
        box = self.query_one("#runs-filter", Input)
        if self.filter or box.has_focus:
            # A filter first: Esc drops it (k9s), the next Esc goes back.
            box.value, self.filter, box.display = "", "", False
            self._fill()
            self.query_one(DataTable).focus()
            return
        self.dismiss(None)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        name = str(event.column_key.value)
        if name in SORT_ORDER:
            self.reverse = not self.reverse if name == self.sort_by else False
            self.sort_by = name
            self._fill()
