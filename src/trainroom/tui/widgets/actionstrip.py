"""A one-line strip over the footer: the action running now and its latest progress line."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive

from .base import Panel


class ActionStrip(Panel):
    view: reactive[str | None] = reactive(None)
    """The progress line, or None when no action runs (the strip is then hidden)."""

    def watch_view(self, view: str | None) -> None:
        self.display = view is not None

    WAITING = ""

    def render_view(self, view: str) -> RenderableType:
        return Text(view, style=self.style("info"), no_wrap=True, overflow="ellipsis")
