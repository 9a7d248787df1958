"""A small braille line chart: 2 x 4 dots a cell, lines between points, horizontal guides.

No plotting dependency: a loss curve, one guide (ln V) and a row of marks is all the control room
draws, and a braille canvas does it in a few lines. Pure: returns characters tagged with what
they show ("curve", a guide's name, "axis", "blank"), and the widget picks the theme's style.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# Bit of the braille dot at (x, y) inside a cell, x in 0..1, y in 0..3 (top down).
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))

MARK_SYMBOLS: dict[str, str] = {
    "checkpoint": "c",
    "restart": "R",
    "lr-change": "L",
    "loss-scale": "s",
    "nonfinite": "!",
}
# When two marks fall in one column, the one that matters more is shown.
_MARK_PRIORITY = {"nonfinite": 4, "restart": 3, "lr-change": 2, "checkpoint": 1, "loss-scale": 0}

Cell = tuple[str, str]


class BrailleCanvas:
    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self._bits = [[0] * cols for _ in range(rows)]

    @property
    def width(self) -> int:
        return self.cols * 2

    @property
    def height(self) -> int:
        return self.rows * 4

    def set(self, x: int, y: int) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self._bits[y // 4][x // 2] |= _DOT[x % 2][y % 4]

    def line(self, x0: int, y0: int, x1: int, y1: int) -> None:
        """Bresenham: every dot between two points, so a steep drop stays one stroke."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.set(x0, y0)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def bits(self, col: int, row: int) -> int:
        return self._bits[row][col]


@dataclass(frozen=True)
class Chart:
    rows: tuple[tuple[Cell, ...], ...]  # the plot area, top row first
    y_labels: tuple[tuple[int, str], ...]  # (row, label) for the axis
    marks: tuple[Cell, ...]  # one cell per column: a mark symbol or a blank
    x_min: float
    x_max: float
    y_min: float
    y_max: float  # in log10 units under a log scale


def _label(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.1e}"


def _y_range(ys: Sequence[float], log_y: bool) -> tuple[float, float]:
    """The y range: the values' own, padded a little. Values that are never negative (a loss)
    are never given a negative bottom (a tick of -0.008) by the padding; under a log scale the
    values are logs already and may be."""
    y_min, y_max = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y_max - y_min < 1e-12:
        y_min, y_max = y_min - 0.5, y_max + 0.5
    pad = (y_max - y_min) * 0.04
    lo, hi = y_min - pad, y_max + pad
    if not log_y and ys and min(ys) >= 0:
        lo = max(lo, 0.0)
    return lo, hi


def chart(
    points: Sequence[tuple[float, float]],
    cols: int,
    rows: int,
    guides: Mapping[str, float] | None = None,
    marks: Sequence[tuple[float, str]] = (),
    log_y: bool = False,
    dots: Sequence[tuple[float, float]] = (),
) -> Chart:
    """Draw `points` (x ascending) into `cols` x `rows` cells, with horizontal `guides` (name ->
    y) and `marks` ((x, kind)) placed on a row under the plot. The y range is the curve's own:
    a guide is drawn where it falls inside it, never stretching it (ln V above a late run's loss
    would flatten the curve to the bottom row). `dots` ((x, y)) are drawn as `•` over the curve
    (a checkpoint's evaluation figure) and kept inside the y range. `log_y`: a log10 scale
    (positive values only)."""
    cols, rows = max(cols, 1), max(rows, 1)
    guides = {k: v for k, v in (guides or {}).items() if v is not None and math.isfinite(v)}
    finite = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    spots = [(x, y) for x, y in dots if math.isfinite(x) and math.isfinite(y)]
    if log_y:
        finite = [(x, math.log10(y)) for x, y in finite if y > 0]
        guides = {k: math.log10(v) for k, v in guides.items() if v > 0}
        spots = [(x, math.log10(y)) for x, y in spots if y > 0]
    ys = [y for _, y in finite + spots] or list(guides.values())
    xs = [x for x, _ in finite] + [x for x, _ in marks if math.isfinite(x)]
    y_min, y_max = _y_range(ys, log_y)
    x_min, x_max = (min(xs), max(xs)) if xs else (0.0, 1.0)
    guides = {k: v for k, v in guides.items() if y_min <= v <= y_max}
    if x_max - x_min < 1e-12:
        x_max = x_min + 1.0
    canvas = BrailleCanvas(cols, rows)

    def px(x: float) -> int:
        return round((x - x_min) / (x_max - x_min) * (canvas.width - 1))

    def py(y: float) -> int:
        return round((y_max - y) / (y_max - y_min) * (canvas.height - 1))

    prev: tuple[int, int] | None = None
    for x, y in finite:
        cur = (px(x), py(y))
        if prev is None:
            canvas.set(*cur)
        else:
            canvas.line(*prev, *cur)
        prev = cur
    guide_rows = {py(v) // 4: name for name, v in guides.items()}
    grid: list[tuple[Cell, ...]] = []
    for r in range(rows):
        row: list[Cell] = []
        for c in range(cols):
            b = canvas.bits(c, r)
            if b:
                row.append((chr(0x2800 + b), "curve"))
            elif r in guide_rows:
                row.append(("╌", guide_rows[r]))
            else:
                row.append((" ", "blank"))
        grid.append(tuple(row))
    for x, y in spots:
        c, r = min(max(px(x) // 2, 0), cols - 1), min(max(py(y) // 4, 0), rows - 1)
        grid[r] = (*grid[r][:c], ("•", "eval"), *grid[r][c + 1 :])
    mark_cells: list[Cell] = [(" ", "blank")] * cols
    best: dict[int, int] = {}
    for x, kind in marks:
        if not math.isfinite(x):
            continue
        c = min(max(px(x) // 2, 0), cols - 1)
        pri = _MARK_PRIORITY.get(kind, -1)
        if pri > best.get(c, -2):
            best[c] = pri
            mark_cells[c] = (MARK_SYMBOLS.get(kind, "*"), kind)
    shown: Callable[[float], str] = (lambda v: _label(10**v)) if log_y else _label
    labels = [(0, shown(y_max)), (rows - 1, shown(y_min))]
    labels.extend((py(v) // 4, shown(v)) for v in guides.values())
    # One label a row; a guide's own value wins over the range ends it lands on.
    by_row = dict(labels)
    return Chart(tuple(grid), tuple(sorted(by_row.items())), tuple(mark_cells), x_min, x_max, y_min, y_max)
