"""The disk guard: checkpoint filesystem usage, time to full, and each checkpoint's state."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import DiskView

from .base import Panel

_STATE_LEVEL = {"verified": "ok", "rejected": "crit", "candidate": "info", "verifying": "info"}


class DiskPanel(Panel[DiskView]):
    TITLE = "disk guard"

    def render_view(self, view: DiskView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        level = view.level if view.level != "ok" else "value"
        if view.known:
            self.pair(t, "used", fmt.percent(view.used_fraction), level)
            self.pair(t, "  free", fmt.nbytes(view.free))
            if view.time_to_full_s is not None:
                self.pair(t, "  full in", fmt.duration(view.time_to_full_s), level)
            if view.path:
                t.append("  " + view.path, style=self.style("dim"))
            t.append("\n")
        else:
            t.append("no disk probe yet\n", style=self.style("dim"))
        if view.finding:
            t.append(view.finding + "\n", style=self.style(view.level))
        if not view.checkpoints:
            t.append("no checkpoints yet", style=self.style("dim"))
        room = max(self.inner_height - t.plain.count("\n"), 1)
        for row in view.checkpoints[:room]:
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
                t.append(f"  {row.reason}", style=self.style("crit" if row.state == "rejected" else "label"))
            t.append("\n")
        if view.pruned:
            t.append(f"{view.pruned} pruned", style=self.style("dim"))
        return t
