"""The trainer's own timing on a log line, where it prints one: what an uninstrumented run's
steps/s is read from before the times the keeper read the lines (a log poll's rounding, and a
block-buffered stdout that arrives 8 KiB at a time, say little about the pace).

- `iteration times`: nanoGPT's `iter 100: loss 2.3456, time 123.45ms, mfu ...` (the last
  iteration's duration: 1000 / 123.45 steps/s);
- `bar rate`: a tqdm bar's `12.34it/s` or `1.23s/it` (HF Trainer's and a plain loop's bar count
  steps, Lightning's TQDM and Rich bars count batches: over `accumulate_grad_batches`, the
  recogniser's `rate_scale`);
- `timestamps`: a leading ISO or `logging` timestamp (`2026-12-04 10:00:00,123 INFO ...`,
  `[2026-12-04T10:00:00.123Z] ...`): the steps between two records over the time between them.

Each is trusted only from the recogniser whose steps it times (a bar's rate from the bar that
counts the steps, nanoGPT's `time` from nanoGPT's line). Linear on bounded lines: `str.find`
and anchored patterns with capped, possessive repetitions (scripts/bench_patterns.py)."""

from __future__ import annotations

import calendar
import math
import re
import statistics
from collections import deque
from typing import Final

import msgspec

from trainroom.core.logs.loglines import LogStep, Recogniser, tqdm_bar
from trainroom.core.vocab import RateSource

# Words for where a run's steps/s came from (status, the control room's cadence panel).
RATE_WORDS: Final[dict[str, str]] = {
    "iteration times": "from the log: the trainer's iteration times",
    "bar rate": "from the log: its progress bar",
    "timestamps": "from the log: its timestamps",
    "read times": "from the log: when its lines were read",
    "reporter": "from the reporter",
}
# The same, short, for the control room's cadence panel (beside the figure).
RATE_SHORT: Final[dict[str, str]] = {
    "iteration times": "log: iteration times",
    "bar rate": "log: progress bar",
    "timestamps": "log: timestamps",
    "read times": "log: read times",
    "reporter": "reporter",
}
# A rate past this is no training loop's (a garbled figure); one under it is kept.
MAX_RATE = 1e7
# The records a pace is read over, and the most time they may span.
WINDOW_RECORDS = 32
WINDOW_S = 30.0
# A bar's elapsed time counts whole seconds: its records must span this long to give the pace.
BAR_SPAN_S = 10.0
BAR_RECORDS = 1024  # a bar redraws every 0.1 s at most: WINDOW_S of its records
# A sampled iteration this many times the median's is left out (an eval or a save inside it).
OUTLIER = 5.0
_AFTER_NUMBER = re.compile(r"(?<![\d.])(?P<v>\d{1,12}+(?:\.\d{1,12}+)?)$")
_CLOCK = re.compile(r"(?:(?P<h>\d{1,6}+):)?(?P<m>\d{1,2}+):(?P<s>\d{2})(?!\d)")
_CLOCK_END = re.compile(r"(?<![\d:])(?:(?P<h>\d{1,6}+):)?(?P<m>\d{1,2}+):(?P<s>\d{2})$")
_MS = re.compile(r"(?P<v>\d{1,12}+(?:\.\d{1,12}+)?)ms")
# A leading timestamp: an optional `[`, the date, `T` or a space, the time, a fraction.
_STAMP = re.compile(
    r"\[?(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[T ](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
    r"(?:[.,](?P<f>\d{1,9}+))?"
)
BAR_RECOGNISERS = ("hf", "tqdm", "lightning")


def bar_rate(line: str) -> float | None:
    """A tqdm bar's rate in its units a second: `12.34it/s`, or `1.23s/it` (None for `?it/s`)."""
    for unit, per in (("it/s", False), ("s/it", True)):
        j = line.find(unit)
        if j <= 0:
            continue
        m = _AFTER_NUMBER.search(line[max(0, j - 26) : j])
        if m is None:
            continue
        v = float(m["v"])
        rate = (1.0 / v if v > 0 else None) if per else v
        return rate if rate is not None and 0 < rate < MAX_RATE else None
    return None


def bar_elapsed(line: str) -> float | None:
    """A bar's elapsed time in seconds: tqdm's `[01:05<` / `[1:01:05,`, Rich's `0:01:05 • `."""
    b = tqdm_bar(line)
    if b is not None:
        m = _CLOCK.match(b.rest.lstrip())
    else:
        j = line.find(" • ")
        m = _CLOCK_END.search(line[max(0, j - 14) : j]) if j > 0 else None
    if m is None:
        return None
    return int(m["h"] or 0) * 3600.0 + int(m["m"]) * 60.0 + int(m["s"])


def iteration_ms(line: str) -> float | None:
    """nanoGPT's `, time 123.45ms` (one iteration's duration) in milliseconds."""
    j = line.find(", time ")
    m = _MS.match(line, j + 7) if j >= 0 else None
    if m is None:
        return None
    v = float(m["v"])
    return v if v > 0 and 1000.0 / v < MAX_RATE else None


def leading_stamp(line: str) -> float | None:
    """A timestamp at the line's start as seconds (read as UTC: only differences are used)."""
    m = _STAMP.match(line.lstrip()[:40])
    if m is None:
        return None
    try:
        whole = calendar.timegm(
            (int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), 0, 0, 0)
        )
    except (ValueError, OverflowError):
        return None
    frac = m["f"]
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


class _Clock:
    """(time, step) points of one clock (timestamps, a bar's elapsed), newest last, at most
    `records` of them and none older than WINDOW_S before the newest: the pace is the steps
    between the oldest and the newest over the time between them."""

    def __init__(self, records: int = WINDOW_RECORDS, min_span: float = 0.0) -> None:
        self.points: deque[tuple[float, int]] = deque(maxlen=records)
        self.min_span = min_span
        self.rate: float | None = None  # the pace at the newest point

    def add(self, t: float, step: int) -> float | None:
        if self.points and (t < self.points[-1][0] or step < self.points[-1][1]):
            self.points.clear()  # the clock or the count went back: a new bar, a restart
            self.rate = None
        if self.points and step == self.points[-1][1]:
            return self.rate  # a redraw of the same step (tqdm's close): as timed at its first line
        self.points.append((t, step))
        while t - self.points[0][0] > WINDOW_S and len(self.points) > 2:
            self.points.popleft()
        t0, s0 = self.points[0]
        span_ok = t - t0 >= max(self.min_span, 1e-9) and step > s0
        self.rate = (step - s0) / (t - t0) if span_ok else None
        return self.rate


class Pace:
    """Times the steps a line gave with the trainer's own timing (`time`): each step gets `rate`,
    the trainer's pace over its last records (steps a second), and `rate_from`.

    - timestamps and a bar's elapsed time: the steps between the oldest of the window's records
      and this one over the time between them (a bar's elapsed counts whole seconds, so it is
      used once its records span BAR_SPAN_S; before that, the bar's own `it/s`, an average of
      rates that runs high when step times vary);
    - nanoGPT's iteration times (one sampled iteration's duration every log_interval): the steps
      covered over their sampled time, a sample past OUTLIER times the median left out (an eval
      or a checkpoint inside one sampled iteration would stand for all the iterations the line
      covers), the attempt's first line too (imports, compile, the first eval)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._stamps = _Clock()
        self._bar = _Clock(BAR_RECORDS, BAR_SPAN_S)
        self._iters: deque[tuple[int, float]] = deque(maxlen=WINDOW_RECORDS)  # (steps, s a step)
        self._last: int | None = None  # the last step timed by iteration times

    def time(self, line: str, steps: list[LogStep], recogniser: Recogniser | None) -> list[LogStep]:
        if not steps or recogniser is None:
            return steps
        name, top = recogniser.name, max(s.step for s in steps)
        rate: float | None = None
        src: RateSource | None = None
        if name == "nanogpt":
            rate, src = self._iteration(iteration_ms(line), top), "iteration times"
        elif name in BAR_RECOGNISERS:
            e = bar_elapsed(line)
            rate = self._bar.add(e, top) if e is not None else None
            if rate is None and (r := bar_rate(line)) is not None:
                rate = r * recogniser.rate_scale()
            src = "bar rate"
        if rate is None:
            t = leading_stamp(line)
            rate, src = (self._stamps.add(t, top) if t is not None else None), "timestamps"
        if rate is None or not (math.isfinite(rate) and 0 < rate < MAX_RATE):
            return steps
        return [msgspec.structs.replace(s, rate=rate, rate_from=src) for s in steps]

    def _iteration(self, ms: float | None, step: int) -> float | None:
        last, self._last = self._last, step
        if ms is None or last is None or step <= last:
            if last is not None and step < last:
                self._iters.clear()  # the step went back: a restart
            return None  # the attempt's first line: its time is the warm-up's
        self._iters.append((step - last, ms / 1000.0))
        bound = OUTLIER * statistics.median(dt for _, dt in self._iters)
        kept = [(n, dt) for n, dt in self._iters if dt <= bound]
        spent = sum(n * dt for n, dt in kept)
        return sum(n for n, _ in kept) / spent if spent > 0 else None
