"""A one-line strip over the footer: the action running now and its latest progress line."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from .base import Panel


class ActionStrip(Panel[str], can_focus=False):
    """Its view is the action's latest progress line, or None when none runs (then it hides)."""

    def watch_view(self, view: str | None) -> None:
        self.display = view is not None

    WAITING = ""

    def render_view(self, view: str) -> RenderableType:
        return Text(view, style=self.style("info"), no_wrap=True, overflow="ellipsis")
