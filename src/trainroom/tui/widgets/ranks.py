"""Every rank side by side, outliers first; the headline is the median and the worst rank, never
only the mean (scenario 8: a mean hid rank 41 at 40.0 among 63 ranks at 2.0)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import RanksView

from .base import Panel

# (column, the width it needs with its padding)
COLUMNS = (("rank", 6), ("step", 7), ("loss", 8), ("t/step", 8), ("tok/s", 7), ("reserved", 10))


class RanksPanel(Panel[RanksView]):
    TITLE = "ranks"

    def render_view(self, view: RanksView) -> RenderableType:
        head = Text(no_wrap=True, overflow="ellipsis")
        self.pair(head, "median", fmt.loss(view.median_loss))
        if view.worst_rank is not None:
            self.pair(head, "  worst", f"r{view.worst_rank} {fmt.loss(view.worst_loss)}")
        if view.slowest_rank is not None and len(view.rows) > 1:
            slowest = f"r{view.slowest_rank} {fmt.step_time(view.slowest_interval_s)}/step"
            if head.cell_len + len("  slowest ") + len(slowest) <= self.inner_width:  # whole or not at all
                self.pair(head, "  slowest", slowest)
        if not view.rows:
            head.append("\nno rank has reported yet", style=self.style("dim"))
            return head
        # Plain aligned text rather than a rich Table: this panel re-renders ten times a second
        # and a Table costs ten times more for the same characters.
        columns: list[tuple[str, int]] = []
        used = 0
        for name, width in COLUMNS:
            if used + width > self.inner_width and len(columns) >= 3:
                break
            columns.append((name, width))
            used += width
        body = Text(no_wrap=True, overflow="ellipsis")
        body.append("".join(name.rjust(width) for name, width in columns) + "\n", style=self.style("label"))
        room = max(self.inner_height - 2, 1)
        if len(view.rows) > room:
            room = max(room - 1, 1)  # a line to say how many more
        for row in view.rows[:room]:
            level = "crit" if row.outlier else ("value" if row.connected else "dim")
            cells = {
                "rank": str(row.rank),
                "step": str(row.step) if row.step is not None else fmt.UNKNOWN,
                "loss": fmt.loss(row.loss),
                "t/step": fmt.step_time(row.interval_s) if row.interval_s else fmt.UNKNOWN,
                "tok/s": fmt.count(row.tokens_per_s),
                "reserved": fmt.nbytes(row.alloc_reserved),
            }
            body.append(
                "".join(cells[name].rjust(width) for name, width in columns) + "\n", style=self.style(level)
            )
        if len(view.rows) > room:
            body.append(f"+{len(view.rows) - room} more ranks", style=self.style("dim"))
        head.append("\n")
        head.append_text(body)
        return head
