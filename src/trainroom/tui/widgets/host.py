"""Host memory: what is available, and the page cache a reclaim could give back (under WSL2 the
Windows side gets it back only when Linux drops it), and the cgroup's own limit where one applies."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import HostView

from .base import Panel


class HostPanel(Panel[HostView]):
    TITLE = "host RAM"

    def render_view(self, view: HostView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        if not view.known or view.reason:
            t.append(view.reason or "no host probe yet", style=self.style("dim"))
            return t
        level = view.level if view.level != "ok" else "value"
        self.pair(t, "available", fmt.nbytes(view.available), level)
        t.append(f" of {fmt.nbytes(view.total)}", style=self.style("label"))
        t.append("\n")
        line = len(t.plain)
        self.pair(t, "page cache", fmt.nbytes(view.page_cache))
        hint = "  reclaimable"
        if view.page_cache and len(t.plain) - line + len(hint) <= self.inner_width:
            t.append(hint, style=self.style("dim"))  # left out whole where it does not fit
        t.append("\n")
        if view.total and view.available is not None:
            t.append("host RAM ", style=self.style("label"))  # what the bar is: the host's memory in use
            width = max(min(self.inner_width - 9, 40), 4)
            bar = fmt.bar(1 - view.available / view.total, width)
            filled = len(bar.rstrip("░"))
            t.append(bar[:filled], style=self.style(view.level if view.level != "ok" else "bar-driver"))
            t.append(bar[filled:], style=self.style("bar-empty"))
            t.append("\n")
        if view.cgroup_limit is not None:
            self.pair(t, "cgroup", f"{fmt.nbytes(view.cgroup_usage)} of {fmt.nbytes(view.cgroup_limit)}")
            if view.effective_available is not None:
                self.pair(t, "  a load gets", fmt.nbytes(view.effective_available), level)
            t.append("\n")
        if view.wsl:
            t.append(
                "WSL2: what Linux frees goes back to Windows only after a reclaim\n", style=self.style("dim")
            )
        if view.finding:
            t.rstrip()
            return Group(t, Text(view.finding, style=self.style(view.level)))
        return t
