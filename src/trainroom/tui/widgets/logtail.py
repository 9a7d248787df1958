"""The last lines of the trainer's log (stdout and stderr of every attempt)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from .base import Panel


class LogTailPanel(Panel[tuple[str, ...]]):
    TITLE = "trainer.log"
    WAITING = "no trainer log yet"

    def render_view(self, view: tuple[str, ...]) -> RenderableType:
        lines = view[-self.inner_height :]
        # Plain text, never markup: a trainer may print anything.
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, line in enumerate(lines):
            if i:
                t.append("\n")
            low = line.lower()
            level = "crit" if ("error" in low or "traceback" in low) else "value"
            t.append(line, style=self.style(level))
        return t
