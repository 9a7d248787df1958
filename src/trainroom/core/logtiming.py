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
from typing import Final, Literal

import msgspec

from trainroom.core.loglines import LogStep, Recogniser

RateFrom = Literal["iteration times", "bar rate", "timestamps"]
# Words for where a run's steps/s came from (status, the control room's cadence panel).
RATE_WORDS: Final[dict[str, str]] = {
    "iteration times": "from the log: the trainer's iteration times",
    "bar rate": "from the log: the progress bar's rate",
    "timestamps": "from the log: its timestamps",
    "read times": "from the log: when its lines were read",
    "reporter": "from the reporter",
}
# A rate past this is no training loop's (a garbled figure); one under it is kept.
MAX_RATE = 1e7
_AFTER_NUMBER = re.compile(r"(?<![\d.])(?P<v>\d{1,12}+(?:\.\d{1,12}+)?)$")
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


class Pace:
    """Times the steps a line gave with the trainer's own timing on that line (`time`): each
    step gets `rate` (steps a second) and `rate_from` where the line has one."""

    def __init__(self) -> None:
        self._stamp: tuple[float, int] | None = None  # (the last timestamp, the step it came with)

    def restart(self) -> None:
        self._stamp = None

    def time(self, line: str, steps: list[LogStep], recogniser: Recogniser | None) -> list[LogStep]:
        if not steps or recogniser is None:
            return steps
        name = recogniser.name
        rate: float | None = None
        src: RateFrom | None = None
        if name == "nanogpt":
            ms = iteration_ms(line)
            rate, src = (1000.0 / ms, "iteration times") if ms is not None else (None, None)
        elif name in BAR_RECOGNISERS:
            r = bar_rate(line)
            rate, src = (r * recogniser.rate_scale(), "bar rate") if r is not None else (None, None)
        if rate is None:
            rate = self._from_stamp(line, max(s.step for s in steps))
            src = "timestamps" if rate is not None else None
        if rate is None or not (math.isfinite(rate) and 0 < rate < MAX_RATE):
            return steps
        return [msgspec.structs.replace(s, rate=rate, rate_from=src) for s in steps]

    def _from_stamp(self, line: str, step: int) -> float | None:
        t = leading_stamp(line)
        if t is None:
            return None
        last, self._stamp = self._stamp, (t, step)
        if last is None or step <= last[1] or t <= last[0]:
            if last is not None and step == last[1]:
                self._stamp = last  # the same step again (a redraw): timed from its first line
            return None
        return (step - last[1]) / (t - last[0])
