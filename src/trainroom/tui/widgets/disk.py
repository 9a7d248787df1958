"""The disk guard: checkpoint filesystem usage (a labelled bar), time to full, and each
checkpoint on disk with its state, newest first. The checkpoint rows scroll under the figures, and
the border says what they count (the title "disk guard · 92 checkpoints", the bottom "checkpoints 1–5
of 92, newest first"), never a count of lines."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import CheckpointRow, DiskView

from .base import Panel

_STATE_LEVEL = {
    "verified": "ok",
    "held": "warn",
    "rejected": "crit",
    "candidate": "info",
    "verifying": "info",
}


_REASON_LEVEL = {"rejected": "crit", "held": "warn"}


class DiskPanel(Panel[DiskView]):
    TITLE = "disk guard"

    def render_view(self, view: DiskView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        level = view.level if view.level != "ok" else "value"
        if view.known:
            # Under a budget the figures are the budget's, said as such; the disk's apart.
            what = "budget" if view.budget else "used"
            self.pair(t, what, fmt.percent(view.used_fraction) + (" used" if view.budget else ""), level)
            if view.budget:
                self.pair(t, " of", fmt.nbytes(view.total))
            self.pair(t, "  free", fmt.nbytes(view.free))
            if view.time_to_full_s is not None:
                self.pair(t, "  full in", fmt.duration(view.time_to_full_s), level)
            if view.path:
                t.append("  " + view.path, style=self.style("dim"))
            t.append("\n")
            if view.used_fraction is not None:
                # What the bar is: the filesystem in use, or the budget (the disk's own said after).
                label = "budget " if view.budget else "disk "
                t.append(label, style=self.style("label"))
                bar = fmt.bar(view.used_fraction, max(min(self.inner_width - len(label), 40), 4))
                filled = len(bar.rstrip("░"))
                t.append(bar[:filled], style=self.style(level if level != "value" else "bar-driver"))
                t.append(bar[filled:] + "\n", style=self.style("bar-empty"))
            if view.budget and view.fs_used_fraction is not None:
                self.pair(t, "disk", fmt.percent(view.fs_used_fraction) + " used")
                t.append("\n")
        else:
            t.append("no disk probe yet\n", style=self.style("dim"))
        if view.finding:
            t.append(view.finding + "\n", style=self.style(view.level))
        rows = view.checkpoints
        self.border_title = disk_title(len(rows), view.pruned)
        if not rows:
            t.append("no checkpoints yet", style=self.style("dim"))
            self._set_subtitle("")
            return t
        room = max(self.inner_height - t.plain.count("\n"), 1)
        start = min(self.scroll_at, max(len(rows) - room, 0))
        shown = rows[start : start + room]
        for row in shown:
            self._row(t, row)
        t.rstrip()
        self._rows_total = len(rows)
        self._rows_room = room
        self._set_subtitle(checkpoints_subtitle(start, len(shown), len(rows)))
        return t

    def _row(self, t: Text, row: CheckpointRow) -> None:
        step = f"step {row.step}" if row.step is not None else row.name
        t.append(step.ljust(11), style=self.style("value"))
        t.append(row.state.ljust(9), style=self.style(_STATE_LEVEL.get(row.state, "dim")))
        size = " " + fmt.nbytes(row.size_bytes)
        latest = "  ← latest" if row.latest else ""
        # Narrow: the size makes way for the `latest` mark rather than cutting it in half.
        if 20 + len(size) + len(latest) <= self.inner_width or not latest:
            t.append(size, style=self.style("label"))
        else:
            latest = latest[1:]
        if row.eval_figure is not None:
            t.append(f"  eval {row.eval_figure:.4g}", style=self.style("value"))
        if latest:
            t.append(latest, style=self.style("ok"))
        # What it holds of a faithful resume, "-opt" for what it lacks; narrow: the lacks only.
        marks = row.parts.split()
        used = len(t.plain) - t.plain.rfind("\n") - 1
        if used + len(row.parts) + 1 > self.inner_width:
            marks = [m for m in marks if m.startswith("-")]
        for mark in marks:
            t.append(" " + mark, style=self.style("warn" if mark.startswith("-") else "label"))
        if row.reason:
            t.append(f"  {row.reason}", style=self.style(_REASON_LEVEL.get(row.state, "label")))
        t.append("\n")

    def window(self, content: RenderableType) -> RenderableType:
        """The panel scrolls its checkpoint rows itself (`render_view`): the figures stay on top."""
        return content

    _rows_total = 0
    _rows_room = 1

    @property
    def max_scroll(self) -> int:
        return max(self._rows_total - self._rows_room, 0)


def disk_title(on_disk: int, pruned: int) -> str:
    """The title counts the checkpoints on disk (every one the keeper tracks, pruned ones left
    out), so a short panel still says how many there are."""
    if not on_disk and not pruned:
        return "disk guard"
    title = f"disk guard · {on_disk} checkpoint{'s' if on_disk != 1 else ''}"
    return title + (f", {pruned} pruned" if pruned else "")


def checkpoints_subtitle(start: int, shown: int, total: int) -> str:
    """Which of the checkpoints the rows show, when not all of them fit."""
    if shown >= total:
        return ""
    return f"checkpoints {start + 1}–{start + shown} of {total}, newest first"
