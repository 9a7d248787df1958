"""The header: which run, which attempt, and the watchdog's verdict as a badge."""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive

from .. import fmt
from ..figures import HeaderView
from .base import PANEL_STYLES, Panel

STATES = ("starting", "running", "slow", "stalled", "hung", "dead", "exited")


class RunHeader(Panel):
    COMPONENT_CLASSES: ClassVar[set[str]] = (
        {f"panel--{n}" for n in PANEL_STYLES}
        | {f"header--state-{s}" for s in STATES}
        | {"header--brand", "header--offline"}
    )
    WAITING = "trainroom · looking for a run…"

    view: reactive[HeaderView | None] = reactive(None)

    def render_view(self, view: HeaderView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" trainroom ", style=self.get_component_rich_style("header--brand"))
        t.append(" ")
        t.append(view.run_id, style=self.style("value"))
        if view.attempt is not None:
            t.append("  attempt ", style=self.style("label"))
            t.append(f"{view.attempt}/{view.attempts}", style=self.style("value"))
        state = view.state if view.state in STATES else "starting"
        t.append("  ")
        # The badge carries the state in words, so it reads the same without colour.
        t.append(f" {view.state.upper()} ", style=self.get_component_rich_style(f"header--state-{state}"))
        if not view.connected:
            t.append(" ")
            t.append(" KEEPER GONE ", style=self.get_component_rich_style("header--offline"))
        if view.state_age_s is not None:
            t.append(f" for {fmt.duration(view.state_age_s)}", style=self.style("label"))
        if view.step is not None:
            t.append("  step ", style=self.style("label"))
            t.append(str(view.step), style=self.style("value"))
        if view.reason:
            t.append("  " + view.reason, style=self.style("label"))
        return t
