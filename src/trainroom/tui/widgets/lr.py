"""The learning rate the optimizer really uses, beside the one the session asked for."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import LrView

from .base import Panel

GROUPS_SHOWN = 3


class LrPanel(Panel[LrView]):
    TITLE = "learning rate"

    def render_view(self, view: LrView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        self.pair(t, "requested", fmt.lr(view.requested))
        if view.warmup_steps:
            self.pair(t, "  warmup", f"{view.warmup_steps} steps")
        t.append("\n")
        if not view.groups:
            t.append("effective: no step reported it yet", style=self.style("dim"))
            return t
        for g in view.groups[:GROUPS_SHOWN]:
            label = "effective" if len(view.groups) == 1 else f"group {g.group}"
            self.pair(t, label.ljust(9), fmt.lr(g.effective), view.level)
            if g.ratio is not None:
                t.append(f" ({fmt.ratio(g.ratio)})", style=self.style(view.level))
            t.append("\n")
        if len(view.groups) > GROUPS_SHOWN:
            t.append(f"+{len(view.groups) - GROUPS_SHOWN} groups\n", style=self.style("dim"))
        if view.finding:
            # the finding's own words (requested, effective, the likely cause) may wrap
            t.rstrip()
            return Group(t, Text(view.finding, style=self.style(view.level)))
        return t
