"""VRAM from both sides: what the driver holds for the run beside what the allocator reserved.

The gap between the two bars is ghost memory (scenario 9: a driver holding ~2x what PyTorch
uses); without a driver view the allocator bar stands alone and the panel says why. Both bars
share one scale (the device's total), so their lengths compare, and each is labelled with what it
measures. Zoomed (`z`), the panel adds every process the driver lists, as nvitop's first screen:
pid, whose it is, the memory it holds, the run's own marked.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.figures import VramView, vram_title

from .base import Panel

LABEL = 10  # "allocator " before the bar
FIGURE = 9  # "11.0 GiB" right-aligned after the bar
DEVICE_GAP = 1 << 30  # the device's use shown beside the run's when it holds this much more


class VramPanel(Panel[VramView]):
    TITLE = "VRAM"

    def _bar(self, t: Text, label: str, value: float | None, scale: float | None, part: str) -> None:
        width = max(min(self.inner_width - LABEL - FIGURE - 1, 48), 4)
        fraction = value / scale if value is not None and scale else None
        t.append(label.ljust(LABEL), style=self.style("label"))
        bar = fmt.bar(fraction, width)
        filled = len(bar.rstrip("░"))
        t.append(bar[:filled], style=self.style(part))
        t.append(bar[filled:], style=self.style("bar-empty"))
        t.append(fmt.nbytes(value).rjust(FIGURE), style=self.style("value"))
        t.append("\n")

    def render_view(self, view: VramView) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        # The border's corners, the number before the title and a space either side.
        self.border_title = vram_title(view.driver_total, view.device, max(self.size.width - 7, 12))
        if view.driver_ok:
            attributed = view.run_bytes if view.per_process else view.driver_used
            scale = view.driver_total or max(attributed or 0, view.alloc_reserved or 0) or None
            # Without per-process figures (WSL2, MIG) the driver side is the device's whole use.
            self._bar(t, "this run" if view.per_process else "device", attributed, scale, "bar-driver")
            if view.per_process and (view.driver_used or 0) - (attributed or 0) >= DEVICE_GAP:
                # The device holds more than the run's processes (another's, an orphan's): that
                # figure too, labelled, on the same scale (`status` says both the same way).
                self._bar(t, "device", view.driver_used, scale, "bar-driver")
        else:
            scale = view.alloc_peak or view.alloc_reserved
            line = f"driver view unavailable: {view.driver_reason}"
            if len(line) > self.inner_width:
                line = f"driver view unavailable:\n {view.driver_reason}"
            t.append(line + "\n", style=self.style("dim"))
        self._bar(t, "allocator", view.alloc_reserved, scale, "bar-allocator")
        self.pair(t, "ratio", fmt.ratio(view.ratio), view.level if view.ratio is not None else "dim")
        t.append(" driver/alloc", style=self.style("label"))
        t.append("\n")
        if view.alloc_allocated is not None:
            self.pair(t, "allocated", fmt.nbytes(view.alloc_allocated))
            self.pair(t, "  peak", fmt.nbytes(view.alloc_peak))
            t.append("\n")
        if view.driver_ok:
            if view.util_percent is not None:
                self.pair(t, "util", f"{view.util_percent:.0f}%")
            if view.power_w is not None:
                self.pair(t, "  power", f"{view.power_w:.0f} W")
        if self.is_maximized:
            self._processes(t, view)
        return t

    def _processes(self, t: Text, view: VramView) -> None:
        t.rstrip()
        t.append("\n\n")  # one blank line under the figures
        if not view.driver_ok:
            t.append("no process table: the driver view is unavailable", style=self.style("dim"))
            return
        if not view.processes:
            t.append("the driver lists no compute process", style=self.style("dim"))
            return
        devices = len({r.device for r in view.processes}) > 1
        head = f"{'pid':>8}  {'gpu ' if devices else ''}{'memory':>9}  whose"
        t.append(head + "\n", style=self.style("label"))
        for row in view.processes:
            level = "value" if row.ours else ("crit" if row.gone else "label")
            t.append(f"{row.pid:>8}  ", style=self.style(level))
            if devices:
                t.append(f"{row.device:<4}", style=self.style(level))
            used = fmt.nbytes(row.used_bytes) if row.used_bytes is not None else "n/a"
            t.append(f"{used:>9}  ", style=self.style(level))
            t.append(("● " if row.ours else "  ") + row.who + "\n", style=self.style(level))
        if not view.per_process:
            t.append("memory n/a: the driver gives no per-process figure here", style=self.style("dim"))
