"""Cadence: steps per second, the age of the last step against the stall bound, a sparkline."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline

from trainroom.core.logs.logtiming import RATE_SHORT
from trainroom.tui import fmt
from trainroom.tui.figures import CadenceView

from .base import Panel, jump_mark


class CadenceFigures(Panel[CadenceView], can_focus=False):
    def render_view(self, view: CadenceView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        if view.halted or view.stopped:
            # The rate of steps that no longer come: said as the last one seen, never as now.
            if view.halted:
                t.append(f"{view.halted.upper()}  ", style=self.style("crit"))
            t.append("was " + fmt.rate(view.steps_per_s, "steps/s"), style=self.style("dim"))
        else:
            t.append(fmt.rate(view.steps_per_s, "steps/s"), style=self.style("value"))
            t.append("  " + fmt.rate(view.interval_s, "s/step"), style=self.style("value"))
        if view.rate_from is not None and view.steps_per_s is not None:
            # Where steps/s came from, on its line (a narrow panel cuts this first, never the bound).
            t.append("  " + RATE_SHORT.get(view.rate_from, view.rate_from), style=self.style("dim"))
        t.append("\n")
        age = view.last_step_age_s
        if view.stopped:
            value = f"{fmt.duration(age)} before the end" if age is not None else "none"
        else:
            value = f"{fmt.duration(age)} ago" if age is not None else "none yet"
        self.pair(t, "last step", value, view.level)
        if not view.stopped:
            t.append(f" / bound {fmt.duration(view.bound_s)}", style=self.style("label"))
        if view.phase != "train":
            self.pair(t, "\nphase", view.phase, "info")
        if view.tokens_per_s is not None:
            t.append(f"\n{fmt.count(view.tokens_per_s)} tok/s", style=self.style("value"))
        if view.last_step_age_s is not None and not view.stopped:
            t.append("\n")
            t.append("to stall ", style=self.style("label"))  # the last step's age against the bound
            width = max(min(self.inner_width - 9, 40), 4)
            bar = fmt.bar(view.last_step_age_s / view.bound_s, width)
            filled = len(bar.rstrip("░"))
            t.append(bar[:filled], style=self.style(view.level))
            t.append(bar[filled:], style=self.style("bar-empty"))
        return t


class CadencePanel(Vertical, can_focus=True):
    """The figures above, the step intervals of the rank that paces the run below."""

    view: reactive[CadenceView | None] = reactive(None)

    def compose(self) -> ComposeResult:
        yield CadenceFigures()
        yield Sparkline([], id="cadence-spark")

    def on_mount(self) -> None:
        self.border_title = jump_mark(self.id) + "cadence"

    def watch_view(self, view: CadenceView | None) -> None:
        self.query_one(CadenceFigures).view = view
        self.query_one(Sparkline).data = list(view.intervals) if view is not None else []
