"""Every rank side by side, outliers first; the headline is the median and the worst rank, never
only the mean (a mean hid rank 41 at 40.0 among 63 ranks at 2.0 in the seeds)."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from .. import fmt
from ..figures import RanksView
from .base import Panel

# (column, the width it needs with its padding)
COLUMNS = (("rank", 6), ("step", 7), ("loss", 8), ("s/step", 8), ("tok/s", 7), ("reserved", 10))


class RanksPanel(Panel):
    TITLE = "ranks"

    view: reactive[RanksView | None] = reactive(None)

    def render_view(self, view: RanksView) -> RenderableType:
        head = Text(no_wrap=True, overflow="ellipsis")
        self.pair(head, "median", fmt.loss(view.median_loss))
        if view.worst_rank is not None:
            self.pair(head, "  worst", f"r{view.worst_rank} {fmt.loss(view.worst_loss)}")
        if view.slowest_rank is not None and len(view.rows) > 1:
            self.pair(head, "  slowest", f"r{view.slowest_rank} {fmt.duration(view.slowest_interval_s)}/step")
        if not view.rows:
            head.append("\nno rank has reported yet", style=self.style("dim"))
            return head
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), expand=True, show_edge=False,
                      header_style=self.style("label"))
        # Columns in order of importance, as many as the width holds.
        columns: list[str] = []
        used = 0
        for name, width in COLUMNS:
            if used + width > self.inner_width and len(columns) >= 3:
                break
            columns.append(name)
            used += width
        for name in columns:
            table.add_column(name, justify="right", no_wrap=True)
        room = max(self.inner_height - 3, 1)
        for row in view.rows[:room]:
            style = self.style("crit") if row.outlier else (self.style("value") if row.connected else self.style("dim"))
            cells = {
                "rank": str(row.rank),
                "step": str(row.step) if row.step is not None else fmt.UNKNOWN,
                "loss": fmt.loss(row.loss),
                "s/step": fmt.duration(row.interval_s) if row.interval_s else fmt.UNKNOWN,
                "tok/s": fmt.count(row.tokens_per_s),
                "reserved": fmt.nbytes(row.alloc_reserved),
            }
            table.add_row(*(cells[c] for c in columns), style=style)
        parts: list[RenderableType] = [head, table]
        if len(view.rows) > room:
            parts.append(Text(f"+{len(view.rows) - room} more ranks", style=self.style("dim")))
        return Group(*parts)
