"""Host memory: what is available, and the page cache a reclaim could give back (under WSL2 the
Windows side gets it back only when Linux drops it)."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive

from .. import fmt
from ..figures import HostView
from .base import Panel


class HostPanel(Panel):
    TITLE = "host RAM"

    view: reactive[HostView | None] = reactive(None)

    def render_view(self, view: HostView) -> RenderableType:
        t = Text(overflow="ellipsis")
        if not view.known:
            t.append("no host probe yet", style=self.style("dim"))
            return t
        level = view.level if view.level != "ok" else "value"
        self.pair(t, "available", fmt.nbytes(view.available), level)
        t.append(f" of {fmt.nbytes(view.total)}", style=self.style("label"))
        self.pair(t, "  cache", fmt.nbytes(view.page_cache))
        t.append("\n")
        if view.total and view.available is not None:
            width = max(min(self.inner_width, 40), 4)
            bar = fmt.bar(1 - view.available / view.total, width)
            filled = len(bar.rstrip("░"))
            t.append(bar[:filled], style=self.style(view.level if view.level != "ok" else "bar-driver"))
            t.append(bar[filled:], style=self.style("bar-empty"))
            t.append("\n")
        if view.cgroup_limit is not None or view.cgroup_usage is not None:
            self.pair(t, "cgroup", f"{fmt.nbytes(view.cgroup_usage)} of {fmt.nbytes(view.cgroup_limit)}")
            t.append("\n")
        if view.finding:
            t.append(view.finding, style=self.style(view.level))
        return t
