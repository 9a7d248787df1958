"""How the control room writes figures: bytes, durations, rates, learning rates.

Pure functions, no Textual: the panels and the tests share them. Bytes, durations and signal
names are `core.units`' (so a panel reads the same as a finding or `status`); the rest are the
control room's own. Unknown values are shown as an em dash, never invented.
"""

from __future__ import annotations

import math
import time

from trainroom.core import units

UNKNOWN = units.UNKNOWN

_BLOCKS = " ▏▎▍▌▋▊▉█"


def nbytes(n: float | None) -> str:
    """1.5 GiB, 400 MiB, 12 KiB (binary units: what nvidia-smi and free show)."""
    return units.fmt_bytes(n)


def duration(s: float | None) -> str:
    """0.4 s, 12 s, 3m07s, 2h05m, 3d04h."""
    return units.fmt_duration(s)


def step_time(s: float | None) -> str:
    """A step's duration: 64 ms, 1.2 s (a fast rank is not `0.0 s`)."""
    if s is None or not math.isfinite(s):
        return UNKNOWN
    return f"{s * 1000:.0f} ms" if s < 1 else duration(s)


def count(n: float | None) -> str:
    """Tokens and other big counts: 950, 12.3k, 4.56M, 1.02G."""
    if n is None:
        return UNKNOWN
    n = float(n)
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def loss(x: float | None) -> str:
    if x is None:
        return UNKNOWN
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.3e}"


def lr(x: float | None) -> str:
    if x is None:
        return UNKNOWN
    return f"{x:.2e}"


def ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return UNKNOWN
    if x >= 100 or x < 0.01:
        return f"{x:.2g}x" if 1e-3 <= x < 1e4 else f"{x:.1e}x"
    return f"{x:.2f}x"


def rate(x: float | None, unit: str) -> str:
    if x is None or not math.isfinite(x):
        return UNKNOWN
    return f"{x:.3g} {unit}"


def percent(fraction: float | None) -> str:
    if fraction is None or not math.isfinite(fraction):
        return UNKNOWN
    return f"{fraction * 100:.0f}%"


def clock(t: float | None) -> str:
    """Local wall time of an event, HH:MM:SS."""
    if t is None:
        return UNKNOWN
    return time.strftime("%H:%M:%S", time.localtime(t))


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar with eighth-block resolution, padded with light shade to `width`."""
    if width <= 0:
        return ""
    if fraction is None or not math.isfinite(fraction):
        return "░" * width
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    out = "█" * full
    if part and full < width:
        out += _BLOCKS[part]
    return out + "░" * (width - len(out))


def shorten(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
