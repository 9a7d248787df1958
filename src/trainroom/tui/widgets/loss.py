"""Loss against tokens, with the ln(V) line a model that learned nothing sits on, and marks for
checkpoints (c), restarts (R), LR changes (L), loss-scale events (s) and non-finite steps (!).

The whole run by default, its y range the curve's own; `log_y` draws a log scale and `recent`
fits the last fifth of the run (late training is not a flat line at the bottom).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive

from trainroom.tui import fmt
from trainroom.tui.figures import LossView
from trainroom.tui.lossplot import recent as recent_points
from trainroom.tui.plot import MARK_SYMBOLS, chart

from .base import Panel

GUTTER = 7  # the y-axis labels


class LossPanel(Panel[LossView]):
    TITLE = "loss"

    log_y: reactive[bool] = reactive(False)
    """A log scale on the y axis."""
    recent: reactive[bool] = reactive(False)
    """Only the recent fifth of the run, its y range fitted to it."""

    def render_view(self, view: LossView) -> RenderableType:
        modes = [m for m, on in (("log", self.log_y), ("recent fifth", self.recent)) if on]
        if view.ranks > 1:
            modes.insert(0, view.curve)
        title = f"loss vs {view.x_label}" + "".join(f" · {m}" for m in modes)
        if self.border_title != title:
            self.border_title = title
        t = Text(no_wrap=True, overflow="crop")
        level = view.level if view.level != "ok" else "value"
        if view.ranks > 1 and view.curve != "median" and view.curve_last is not None:
            # The headline is the curve's own figure, named for whose it is: a median of the ranks
            # above rank 0's curve would say a figure the plot does not show (with one rank off,
            # the median of two is neither curve).
            self.pair(t, view.curve, fmt.loss(view.curve_last), level)
        else:
            self.pair(t, "median", fmt.loss(view.median), level)
        if view.ranks > 1 and view.worst_rank is not None:
            self.pair(t, "  worst", f"r{view.worst_rank} {fmt.loss(view.worst)}", view.level)
        if view.ln_v is not None:
            self.pair(t, "  ln V", f"{view.ln_v:.2f}", "lnv")
            t.append(f" (V={view.vocab_size})", style=self.style("label"))
        t.append("\n")
        rows = self.inner_height - 3
        cols = self.inner_width - GUTTER - 1
        if rows < 2 or cols < 8:
            return t
        if not view.points:
            t.append("no loss reported yet", style=self.style("dim"))
            return t
        points = recent_points(view.points) if self.recent else view.points
        x_lo = points[0][0] if self.recent and points else None
        c = chart(
            points,
            cols,
            rows,
            guides={"lnv": view.ln_v} if view.ln_v else None,
            marks=[(m.x, m.kind) for m in view.marks if x_lo is None or m.x >= x_lo],
            log_y=self.log_y,
            dots=[(x, y) for x, y in view.evals if x_lo is None or x >= x_lo],
        )
        labels = dict(c.y_labels)
        styles = {k: self.style(k) for k in ("curve", "lnv", "axis", "mark")}
        for r, row in enumerate(c.rows):
            t.append(labels.get(r, "").rjust(GUTTER - 1)[: GUTTER - 1] + " ", style=styles["axis"])
            t.append("┤" if r in labels else "│", style=styles["axis"])
            _append_runs(
                t,
                row,
                lambda kind: styles[
                    "curve"
                    if kind == "curve"
                    else "lnv"
                    if kind == "lnv"
                    else "mark"
                    if kind == "eval"
                    else "axis"
                ],
            )
            t.append("\n")
        t.append(" " * GUTTER + "└", style=styles["axis"])
        _append_runs(t, c.marks, lambda kind: styles["mark" if kind != "blank" else "axis"])
        t.append("\n")
        lo_text, hi_text = _x(c.x_min, view.x_label), _x(c.x_max, view.x_label)
        kinds = sorted({m.kind for m in view.marks})
        legend = " ".join(f"{MARK_SYMBOLS.get(k, '*')} {k}" for k in kinds) + (
            " • eval" if view.evals else ""
        )
        legend = legend.strip()
        space = cols - len(lo_text) - len(hi_text)
        middle = f" {legend} " if legend and len(legend) + 2 <= space else ""
        t.append(" " * GUTTER + " " + lo_text, style=self.style("axis"))
        t.append(middle.center(max(space, 0)), style=self.style("label"))
        t.append(hi_text, style=self.style("axis"))
        return t


def _append_runs(t: Text, cells: tuple[tuple[str, str], ...], style_of: Callable[[str], Style]) -> None:
    """One span per run of cells of one kind: a plot row is ~100 cells but a few spans, which is
    what keeps ten renders a second cheap."""
    run: list[str] = []
    kind = None
    for ch, k in cells:
        if k != kind and run:
            t.append("".join(run), style=style_of(kind or "blank"))
            run = []
        kind = k
        run.append(ch)
    if run:
        t.append("".join(run), style=style_of(kind or "blank"))


def _x(v: float, label: str) -> str:
    return fmt.count(v) if label == "tokens" else f"{v:.0f}"
