"""The loss plot's points and marks: the run's `core.series` snapshot (the whole run,
downsampled) when it has enough, else the recent raw steps; then thinned evenly over the whole
x range (never the last N: the start of the run stays on the plot). Pure, no Textual."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from trainroom.core.run.series import SeriesSnapshot
from trainroom.core.run.state import RunState
from trainroom.core.vocab import LossMark

LOSS_POINTS = 2000  # what the plot keeps at most, whatever the source holds
RECENT_SHARE = 0.2  # the recent window: the last fifth of the run's x range


@dataclass(frozen=True)
class Mark:
    x: float
    kind: LossMark
    step: int | None = None  # a checkpoint's step (its evaluation figure is drawn at its x)


@dataclass(frozen=True)
class PlotPoints:
    points: tuple[tuple[float, float], ...]  # (tokens or step, loss), finite losses only
    marks: tuple[Mark, ...]
    x_label: str  # "tokens" or "step"
    source: str = "median"  # whose loss the curve is: "rank 0" (the run's series) or the ranks' "median"
    # The trainer's own evaluation of each promoted checkpoint ([eval]), at its checkpoint's x.
    evals: tuple[tuple[float, float], ...] = ()


def plot_points(state: RunState, series: SeriesSnapshot | None = None) -> PlotPoints:
    points: list[tuple[float, float]] = []
    marks: list[Mark] = []
    x_label = "tokens"
    source = "rank 0"  # the series folds rank 0's steps
    if series is not None:
        points, marks, x_label = _series_points(series)
    if len(points) < 2:
        points, marks, x_label = _recent_points(state)
        source = "median"
    figures = {
        c.step: c.eval.figure
        for c in state.checkpoints
        if c.step is not None and c.eval is not None and c.eval.figure is not None and c.state == "verified"
    }
    evals = sorted({(m.x, figures[m.step]) for m in marks if m.kind == "checkpoint" and m.step in figures})
    return PlotPoints(
        points=tuple(thin(points, LOSS_POINTS)),
        marks=tuple(marks),
        x_label=x_label,
        source=source,
        evals=tuple(evals),
    )


def thin(points: list[tuple[float, float]], most: int) -> list[tuple[float, float]]:
    """At most `most` points spread evenly over the whole x range: equal-width bins, each kept
    as its lowest and highest point in x order (a spike stays visible)."""
    if len(points) <= most:
        return points
    bins = max(most // 2, 1)
    x0, x1 = min(x for x, _ in points), max(x for x, _ in points)
    width = (x1 - x0) / bins or 1.0
    lo: dict[int, tuple[float, float]] = {}
    hi: dict[int, tuple[float, float]] = {}
    for x, y in points:
        b = min(int((x - x0) / width), bins - 1)
        if b not in lo or y < lo[b][1]:
            lo[b] = (x, y)
        if b not in hi or y > hi[b][1]:
            hi[b] = (x, y)
    ends = {min(points), max(points)}  # the run's first and last point stay whatever the bins kept
    kept = set(ends)
    for b in lo:
        kept.update((lo[b], hi[b]))
    return sorted(kept)


def recent(
    points: tuple[tuple[float, float], ...], share: float = RECENT_SHARE
) -> tuple[tuple[float, float], ...]:
    """The points in the last `share` of the x range (at least two when there are two)."""
    if len(points) < 3:
        return points
    x0, x1 = min(x for x, _ in points), max(x for x, _ in points)
    cut = x1 - (x1 - x0) * share
    kept = tuple(pt for pt in points if pt[0] >= cut)
    return kept if len(kept) >= 2 else points[-2:]


def _series_points(series: SeriesSnapshot) -> tuple[list[tuple[float, float]], list[Mark], str]:
    """The min/max buckets of `core.series` (the whole run, downsampled): each bucket is drawn
    from its min to its max at its centre, so a spike inside a bucket stays visible."""
    points: list[tuple[float, float]] = []
    col = series.loss
    marks = [Mark(m.x, m.kind, m.step) for m in series.marks]
    for k, x in enumerate(series.centres()):
        lo = col.lo[k] if k < len(col.lo) else None
        hi = col.hi[k] if k < len(col.hi) else None
        points += [(x, y) for y in ((lo, hi) if lo != hi else (lo,)) if y is not None and math.isfinite(y)]
        if col.nonfinite and k < len(col.nonfinite) and col.nonfinite[k]:
            marks.append(Mark(x, "nonfinite"))
    return points, marks, "step" if series.x_unit == "steps" else "tokens"


def _recent_points(state: RunState) -> tuple[list[tuple[float, float]], list[Mark], str]:
    """The recent raw steps: the median loss over ranks per (attempt, step), against tokens
    when every step carries them, else against the step number."""
    by_step: dict[tuple[int, int], list[float]] = {}
    x_of: dict[tuple[int, int], float] = {}
    use_tokens = bool(state.recent_steps) and all(r.tokens is not None for r in state.recent_steps)
    nonfinite: list[tuple[int, int]] = []
    for r in state.recent_steps:
        key = (r.attempt, r.step)
        x_of[key] = max(
            x_of.get(key, 0.0), float(r.tokens if use_tokens and r.tokens is not None else r.step)
        )
        if r.loss is None:
            continue
        if math.isfinite(r.loss):
            by_step.setdefault(key, []).append(r.loss)
        else:
            nonfinite.append(key)
    keys = sorted(x_of, key=lambda k: (k[0], k[1]))
    points = [(x_of[k], statistics.median(by_step[k])) for k in keys if k in by_step]
    marks: list[Mark] = []
    step_x = {k[1]: x_of[k] for k in keys}
    seen_attempts: set[int] = set()
    for k in keys:
        if k[0] not in seen_attempts:
            if seen_attempts:
                marks.append(Mark(x_of[k], "restart"))
            seen_attempts.add(k[0])
    marks += [
        Mark(step_x[c.step], "checkpoint", c.step)
        for c in state.checkpoints
        if c.step is not None and c.step in step_x
    ]
    for n in state.notes:
        step = n.get("step")
        kind = str(n.get("kind", ""))
        if isinstance(step, int) and step in step_x and kind.startswith(("lr", "loss-scale")):
            marks.append(Mark(step_x[step], "lr-change" if kind.startswith("lr") else "loss-scale"))
    marks += [Mark(x_of[k], "nonfinite") for k in nonfinite]
    return points, marks, "tokens" if use_tokens else "step"
