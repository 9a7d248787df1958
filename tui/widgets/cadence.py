"""Cadence: steps per second, the age of the last step against the stall bound, a sparkline."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline

from .. import fmt
from ..figures import CadenceView
from .base import Panel


class CadenceFigures(Panel):
    view: reactive[CadenceView | None] = reactive(None)

    def render_view(self, view: CadenceView) -> RenderableType:
        t = Text(overflow="ellipsis")
        self.pair(t, "", fmt.rate(view.steps_per_s, "steps/s"))
        self.pair(t, "  ", fmt.rate(view.interval_s, "s/step"))
        if view.tokens_per_s is not None:
            self.pair(t, "  ", f"{fmt.count(view.tokens_per_s)} tok/s")
        t.append("\n")
        if view.stopped:
            label = "last step"
            value = (f"{fmt.duration(view.last_step_age_s)} before the end"
                     if view.last_step_age_s is not None else "none")
        else:
            label = "last step"
            value = f"{fmt.duration(view.last_step_age_s)} ago" if view.last_step_age_s is not None else "none yet"
        self.pair(t, label, value, view.level)
        self.pair(t, "  bound", fmt.duration(view.bound_s))
        if view.phase != "train":
            self.pair(t, "  phase", view.phase, "info")
        if view.last_step_age_s is not None and not view.stopped:
            t.append("\n")
            width = max(min(self.inner_width, 40), 4)
            bar = fmt.bar(view.last_step_age_s / view.bound_s, width)
            filled = len(bar.rstrip("░"))
            t.append(bar[:filled], style=self.style(view.level))
            t.append(bar[filled:], style=self.style("bar-empty"))
        return t


class CadencePanel(Vertical):
    """The figures above, the step intervals of the rank that paces the run below."""

    view: reactive[CadenceView | None] = reactive(None)

    def compose(self) -> ComposeResult:
        yield CadenceFigures()
        yield Sparkline([], id="cadence-spark")

    def on_mount(self) -> None:
        self.border_title = "cadence"

    def watch_view(self, view: CadenceView | None) -> None:
        self.query_one(CadenceFigures).view = view
        self.query_one(Sparkline).data = list(view.intervals) if view is not None else []
