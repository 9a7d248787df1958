"""The trainer: its pid and process group (what kill signals), uptime, and how it ended."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import TrainerView

from .base import Panel

_TELEMETRY = {"waiting": "not heard yet", "none": "none", "unrecognised": "no step"}


class TrainerPanel(Panel[TrainerView]):
    TITLE = "trainer"

    def render_view(self, view: TrainerView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        self.pair(t, "pid", str(view.pid) if view.pid is not None else fmt.UNKNOWN)
        self.pair(t, "  pgid", str(view.pgid) if view.pgid is not None else fmt.UNKNOWN)
        t.append("\n")
        t.append(view.exit_text, style=self.style(view.exit_level))
        t.append("\n")
        if view.crash:
            t.append(view.crash, style=self.style("crit"))
            t.append("\n")
        self.pair(t, "up" if view.alive else "ran", fmt.duration(view.uptime_s))
        mode = _TELEMETRY.get(view.telemetry, view.telemetry)
        self.pair(t, "  telemetry", mode, "value" if view.telemetry == "reporter" else "dim")
        if view.resume_from:
            self.pair(t, "  from", view.resume_from.rstrip("/").rsplit("/", 1)[-1])
        t.append("\n")
        if view.telemetry == "unrecognised":  # lines of their own: the panel is narrow
            t.append("log read, no step or loss in it:\npass --log-pattern\n", style=self.style("warn"))
        t.append(fmt.shorten(view.command, self.inner_width * 2), style=self.style("dim"))
        if view.alive and self.inner_height > 6:  # zoomed: room to say where the rest is
            t.append("\n\n")
            t.append("p", style=self.style("label"))
            t.append(
                "  every process of the run as a tree: ranks, workers, CPU %, RSS, GPU memory;",
                style=self.style("dim"),
            )
            t.append("\n   a signal of your choice to one of them", style=self.style("dim"))
        return t
