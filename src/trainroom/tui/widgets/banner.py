"""The disconnect banner: since when the keeper is gone, the journal's last state, the way back."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import RenderableType
from rich.text import Text

from trainroom.core.vocab import StateName
from trainroom.tui import fmt

from .base import Panel


@dataclass(frozen=True)
class BannerView:
    since: float
    reason: str
    state: StateName  # the journal's last verdict
    state_reason: str
    last_step: int | None
    now: float
    resume_key: str  # as the keymap has it now
    busy: bool = False  # its process lives but does not answer
    way_on: str = ""  # why R cannot act now (an orphan to kill or take back), else empty


class DisconnectBanner(Panel[BannerView], can_focus=False):
    WAITING = ""

    def render_view(self, v: BannerView) -> RenderableType:
        # Line 1: since when, and the way back; line 2: what the journal says and why it ended.
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(
            f"keeper {'not answering' if v.busy else 'gone'} since {fmt.clock(v.since)} "
            f"({fmt.duration(v.now - v.since)} ago)",
            style=self.style("crit"),
        )
        if v.way_on:
            # R would not act (a trainer runs on without its keeper): the ways on, in place of the
            # journal's last state, which still says it runs.
            t.append(f"\n{v.way_on}", style=self.style("info"))
            return t
        t.append(f"  ·  press {v.resume_key} to resume", style=self.style("info"))
        t.append("\njournal's last state: ", style=self.style("label"))
        t.append(
            v.state.upper(), style=self.style("crit" if v.state in ("dead", "hung", "stalled") else "value")
        )
        if v.last_step is not None:
            t.append(f", last step {v.last_step}", style=self.style("value"))
        if v.state_reason:
            t.append(f" ({v.state_reason})", style=self.style("label"))
        t.append(f"  ·  {v.reason}", style=self.style("label"))
        return t
