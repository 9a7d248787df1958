"""The history screen's graphs (btop's): host RAM and page cache, VRAM as the driver and the
allocator see it, GPU utilisation, power and temperature, the run's CPU, disk free and the run's
write rate, over a window of the run's life (the last 5 min, the last hour, all of it).

Pure: the samples come from the journal's `Vitals` records (`run.vitals`), the lines from here;
the screen only styles them. A figure nobody measured is a line saying so and why, never a flat
zero. Units and the graph style are the person's options (`options.RoomOptions`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainroom.core.samples import VitalsSample

from . import fmt
from .plot import BrailleCanvas

WINDOWS: tuple[tuple[str, float | None], ...] = (("5 min", 300.0), ("1 h", 3600.0), ("all", None))
_BLOCKS = " ▁▂▃▄▅▆▇█"
GUTTER = 10  # the y labels' width


@dataclass(frozen=True)
class Metric:
    label: str
    get: Callable[[VitalsSample], float | None]
    unit: str  # bytes, rate, percent, watts, celsius
    unmeasured: str  # why it can be missing, in words


METRICS: tuple[Metric, ...] = (
    Metric("host RAM used", lambda v: v.mem_used_bytes, "bytes", "host memory view unavailable"),
    Metric("page cache", lambda v: v.page_cache_bytes, "bytes", "host memory view unavailable"),
    Metric("VRAM (driver)", lambda v: v.vram_used_bytes, "bytes", "no driver reading"),
    Metric(
        "VRAM (allocator)",
        lambda v: v.alloc_reserved_bytes,
        "bytes",
        "the trainer reports no allocator figures (not instrumented, or on CPU)",
    ),
    Metric("GPU util", lambda v: v.gpu_util_percent, "percent", "no driver reading"),
    Metric("GPU power", lambda v: v.gpu_power_w, "watts", "no driver reading"),
    Metric("GPU temp", lambda v: v.gpu_temp_c, "celsius", "no driver reading"),
    Metric("run CPU", lambda v: v.cpu_percent, "percent", "no live process of the run"),
    Metric("disk free", lambda v: v.disk_free_bytes, "bytes", "the checkpoint disk is not read yet"),
    Metric("disk writes", lambda v: v.disk_write_bps, "rate", "no live process of the run"),
)


@dataclass(frozen=True)
class HistLine:
    text: str
    kind: str  # "title", "graph", "axis", "missing"


def figure(v: float | None, unit: str, units: str = "binary") -> str:
    if v is None or not math.isfinite(v):
        return fmt.UNKNOWN
    if unit in ("bytes", "rate"):
        text = fmt.nbytes(v) if units == "binary" else _decimal(v)
        return text + ("/s" if unit == "rate" else "")
    if unit == "percent":
        return f"{v:.0f} %"
    if unit == "watts":
        return f"{v:.0f} W"
    return f"{v:.0f} °C"


def _decimal(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _top(ys: Sequence[float]) -> float:
    """The graph's top: the highest value, never under 1 (a flat zero still draws a floor)."""
    return max(max(ys, default=0.0), 1.0)


def _braille(points: Sequence[tuple[float, float]], cols: int, rows: int, x0: float, x1: float) -> list[str]:
    """A line from 0 (the bottom) to the highest value (the top), over the window's time."""
    canvas = BrailleCanvas(cols, rows)
    top = _top([y for _, y in points])
    width = (x1 - x0) or 1.0
    prev: tuple[int, int] | None = None
    for x, y in points:
        cur = (
            round((x - x0) / width * (canvas.width - 1)),
            round((1.0 - max(y, 0.0) / top) * (canvas.height - 1)),
        )
        if prev is None:
            canvas.set(*cur)
        else:
            canvas.line(*prev, *cur)
        prev = cur
    return [
        "".join(chr(0x2800 + canvas.bits(c, r)) if canvas.bits(c, r) else " " for c in range(cols))
        for r in range(rows)
    ]


def _blocks(points: Sequence[tuple[float, float]], cols: int, rows: int, x0: float, x1: float) -> list[str]:
    """A bar per column (the highest value that fell in it), in eighths of a row, from 0."""
    lo = 0.0
    span = _top([y for _, y in points])
    heights = [-1.0] * cols
    width = (x1 - x0) or 1.0
    for x, y in points:
        c = min(int((x - x0) / width * cols), cols - 1)
        heights[c] = max(heights[c], (y - lo) / span * rows * 8)
    out = []
    for r in range(rows):
        base = (rows - 1 - r) * 8
        line = "".join(
            " " if h < 0 else _BLOCKS[max(0, min(8, round(h - base)))] if h > base else " " for h in heights
        )
        out.append(line)
    return out


def history_lines(
    samples: Sequence[VitalsSample],
    window: int,
    cols: int,
    rows: int,
    *,
    units: str = "binary",
    style: str = "braille",
    gpu_note: str | None = None,
) -> tuple[HistLine, ...]:
    """Every metric's title and graph for `window` (an index of WINDOWS) in `cols` x `rows`."""
    name, seconds = WINDOWS[window % len(WINDOWS)]
    if samples and seconds is not None:
        cut = samples[-1].t - seconds
        samples = [v for v in samples if v.t >= cut]
    if not samples:
        return (HistLine("no samples yet: the keeper journals one every 5 s while it probes", "missing"),)
    measured = [(m, [(v.t, y) for v in samples if (y := m.get(v)) is not None]) for m in METRICS]
    drawn = [(m, pts) for m, pts in measured if pts]
    missing = [m for m, pts in measured if not pts]
    lines: list[HistLine] = []
    span = samples[-1].t - samples[0].t
    lines.append(
        HistLine(
            f"window: {name} ({len(samples)} samples over {fmt.duration(span)}) · "
            f"{'binary' if units == 'binary' else 'decimal'} units · {style}",
            "axis",
        )
    )
    said = set()
    for m in missing:
        why = gpu_note if gpu_note and m.unmeasured == "no driver reading" else m.unmeasured
        if m.unmeasured == "no driver reading" and "gpu" in said:
            continue  # the GPU's reason once, for all of its figures
        if m.unmeasured == "no driver reading":
            said.add("gpu")
            lines.append(
                HistLine(f"GPU util · power · temp · VRAM (driver): {fmt.UNKNOWN} ({why})", "missing")
            )
            continue
        lines.append(HistLine(f"{m.label}: {fmt.UNKNOWN} ({why})", "missing"))
    room = max(rows - len(lines), 0)
    if not drawn or room < 2:
        return tuple(lines)
    graph_rows = max(1, room // len(drawn) - 1)
    x0 = samples[0].t
    x1 = samples[-1].t if samples[-1].t > x0 else x0 + 1.0
    plot_cols = max(cols - GUTTER, 4)
    for m, pts in drawn:
        ys = [y for _, y in pts]
        lines.append(
            HistLine(
                f"{m.label}  {figure(ys[-1], m.unit, units)}  "
                f"(min {figure(min(ys), m.unit, units)}, max {figure(max(ys), m.unit, units)})",
                "title",
            )
        )
        draw = _blocks if style == "blocks" else _braille
        body = draw(pts, plot_cols, graph_rows, x0, x1)
        top = figure(_top(ys), m.unit, units)
        for i, row in enumerate(body):
            label = top if i == 0 else "0" if i == len(body) - 1 else ""
            lines.append(HistLine(label.rjust(GUTTER - 1)[: GUTTER - 1] + "│" + row, "graph"))
    return tuple(lines)
