"""Robust statistics: median and MAD, never mean and std, so one absurd batch does not move the
baseline it is measured against. What the sanity rules measure a loss, a grad norm or a rank by."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence

# MAD x 1.4826 estimates the standard deviation of normal noise, so the thresholds read as sigmas.
MAD_TO_SIGMA = 1.4826


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def robust_level(values: Sequence[float]) -> tuple[float, float]:
    """(median, sigma from the MAD) of `values` (non-empty, finite)."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return med, MAD_TO_SIGMA * mad


def trend_robust_level(values: Sequence[float], recent: int) -> tuple[float, float]:
    """(median of the latest `recent` values, noise sigma from the MAD of successive differences)
    of `values` (at least two, finite). The difference of two noisy values has sqrt(2) x the
    noise, and a smooth trend only shifts the differences' median, which the MAD removes."""
    vals = list(values)
    base = statistics.median(vals[-recent:] if recent > 0 else vals)
    diffs = [b - a for a, b in itertools.pairwise(vals)]
    dmed = statistics.median(diffs)
    mad = statistics.median([abs(d - dmed) for d in diffs])
    return base, MAD_TO_SIGMA * mad / math.sqrt(2)


class Rolling:
    """A bounded window with a cached (median, sigma), re-sorted every `refresh` appends."""

    __slots__ = ("_since", "level", "min_n", "recent", "refresh", "values")

    def __init__(self, size: int, refresh: int, min_n: int, recent: int | None = None) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.refresh = max(1, refresh)
        self.min_n = max(2, min_n)
        self._since = 0
        self.level: tuple[float, float] | None = None
        # None: (median, MAD sigma) of the window; else trend_robust_level with this recent part.
        self.recent = recent

    def append(self, v: float) -> None:
        self.values.append(v)
        self._since += 1
        if len(self.values) >= self.min_n and (self.level is None or self._since >= self.refresh):
            self.level = (
                robust_level(self.values)
                if self.recent is None
                else trend_robust_level(self.values, self.recent)
            )
            self._since = 0
