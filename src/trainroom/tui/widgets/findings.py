"""Open findings, most severe first then newest, each with the key of its suggested action."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui.figures import FindingRow

from .base import Panel

_SEVERITY = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}


class FindingsPanel(Panel[tuple[FindingRow, ...]]):
    TITLE = "findings"

    def render_view(self, view: tuple[FindingRow, ...]) -> RenderableType:
        self.border_title = f"findings ({len(view)})" if view else "findings"
        t = Text()
        if not view:
            t.append("none open", style=self.style("dim"))
            return t
        for i, f in enumerate(view):
            if i:
                t.append("\n")
            t.append(_SEVERITY.get(f.severity, f.severity.upper()) + " ", style=self.style(f.level))
            t.append(f.code, style=self.style(f.level))
            if f.key:
                t.append(f" [{f.key}] {f.action}", style=self.style("info"))
            t.append("  " + f.message, style=self.style("value"))
        return t
