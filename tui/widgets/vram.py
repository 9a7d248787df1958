"""VRAM from both sides: what the driver holds for the run beside what the allocator reserved.

The gap between the two bars is the ghost memory of the seeds (a driver holding ~2x what PyTorch
uses); without a driver view the allocator bar stands alone and the panel says why.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text
from textual.reactive import reactive

from .. import fmt
from ..figures import VramView
from .base import Panel

LABEL = 7


class VramPanel(Panel):
    TITLE = "VRAM"

    view: reactive[VramView | None] = reactive(None)

    def _bar(self, t: Text, label: str, value: float | None, scale: float | None, part: str,
             note: str) -> None:
        width = max(min(self.inner_width - LABEL - len(note) - 2, 40), 4)
        fraction = value / scale if value is not None and scale else None
        t.append(label.ljust(LABEL), style=self.style("label"))
        bar = fmt.bar(fraction, width)
        filled = len(bar.rstrip("░"))
        t.append(bar[:filled], style=self.style(part))
        t.append(bar[filled:], style=self.style("bar-empty"))
        t.append(" " + note, style=self.style("value"))
        t.append("\n")

    def render_view(self, view: VramView) -> RenderableType:
        t = Text(overflow="ellipsis")
        if view.driver_ok:
            attributed = view.run_bytes if view.per_process else view.driver_used
            scale = view.driver_total or max(attributed or 0, view.alloc_reserved or 0) or None
            who = "run" if view.per_process else "device"
            self._bar(t, "driver", attributed, scale, "bar-driver",
                      f"{fmt.nbytes(attributed)} {who} / {fmt.nbytes(view.driver_total)}")
        else:
            scale = view.alloc_peak or view.alloc_reserved
            t.append(f"driver view unavailable: {view.driver_reason}\n", style=self.style("dim"))
        self._bar(t, "alloc", view.alloc_reserved, scale, "bar-allocator",
                  f"{fmt.nbytes(view.alloc_reserved)} reserved")
        self.pair(t, "ratio", fmt.ratio(view.ratio), view.level if view.ratio is not None else "dim")
        t.append(" driver/alloc", style=self.style("label"))
        if view.alloc_allocated is not None:
            self.pair(t, "  allocated", fmt.nbytes(view.alloc_allocated))
        if view.driver_ok:
            t.append("\n")
            if view.device:
                t.append(view.device + "  ", style=self.style("dim"))
            if not view.per_process:
                t.append("no per-process figure: device total  ", style=self.style("dim"))
            if view.util_percent is not None:
                self.pair(t, "util", f"{view.util_percent:.0f}%")
            if view.power_w is not None:
                self.pair(t, "  power", f"{view.power_w:.0f} W")
        return t
