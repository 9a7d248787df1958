"""The runs overview (k9s-like): every run under the state dir in one line each, sortable;
Enter opens one in the control room, Esc goes back to the run watched before."""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Label

from trainroom.tui import fmt
from trainroom.tui.overview import SORT_ORDER, RunRow, ordered
from trainroom.tui.verdict import SEVERITY_LEVEL

COLUMNS = ("run", "state", "step", "loss", "steps/s", "worst", "age", "command")


class RunsScreen(Screen[str | None]):
    """Dismissed with the run id to open, or None (back, or no run picked)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,o", "back", "back", id="trainroom.runs.back", tooltip="Back to the run watched before"
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
        self._style: dict[str, Style] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="runs-box"):
            yield Label(self._title(), id="runs-title")
            yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=False)
            yield Label(
                "enter: open · s: sort by the next column · S: reverse · esc: back · q: quit",
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
        table = self.query_one(DataTable)
        for c in COLUMNS:
            table.add_column(c, key=c)
        self._fill()
        table.focus()

    def _title(self) -> str:
        live = sum(1 for r in self.rows if r.training)
        base = self.title_text or f"runs: {len(self.rows)}, {live} live"
        way = "descending" if not self.reverse else "reversed"
        return f"{base} · sorted by {self.sort_by} ({way})"

    def update_rows(self, rows: list[RunRow], now: float) -> None:
        self.rows, self.now = rows, now
        self._fill()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        keep = self._cursor_run()
        table.clear()
        for r in ordered(self.rows, self.sort_by, self.reverse):
            table.add_row(*self._cells(r), key=r.run_id)
        if keep is not None and keep in {r.run_id for r in self.rows}:
            table.move_cursor(row=table.get_row_index(keep))
        elif self.current is not None and self.current in {r.run_id for r in self.rows}:
            table.move_cursor(row=table.get_row_index(self.current))
        self.query_one("#runs-title", Label).update(self._title())

    def _cursor_run(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None

    def _cells(self, r: RunRow) -> list[Text]:
        level = r.level
        state = r.state.upper() + ("" if r.keeper else " · keeper gone")
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
            Text(fmt.rate(r.steps_per_s, "") if r.steps_per_s else "—", justify="right"),
            worst,
            Text(fmt.duration(max(self.now - r.created, 0.0)), justify="right"),
            Text(fmt.shorten(r.error or r.command, 60), style="dim"),
        ]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_sort(self) -> None:
        i = SORT_ORDER.index(self.sort_by)
        self.sort_by = SORT_ORDER[(i + 1) % len(SORT_ORDER)]
        self._fill()

    def action_reverse(self) -> None:
        self.reverse = not self.reverse
        self._fill()

    def action_back(self) -> None:
        self.dismiss(None)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        name = str(event.column_key.value)
        if name in SORT_ORDER:
            self.reverse = not self.reverse if name == self.sort_by else False
            self.sort_by = name
            self._fill()
