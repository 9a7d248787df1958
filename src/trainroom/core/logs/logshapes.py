"""Log-line telemetry for plain training loops: what a hand-written loop prints, read with no
configuration (core/logs/logformats tries it after the framework recognisers).

- tqdm bars, with or without a description, with a postfix (`loss=2.31, lr=3e-4`) or without; a
  bar over one epoch's batches is followed across epochs (its count restarts, the step goes on).
  Bars that load, map, download or evaluate are someone else's; `Epoch N:` bars are Lightning's.
- Lines of pairs naming a step and a loss, LR or grad norm: `key=value`, `key: value` or
  `key value` (`step 10 loss 2.31 lr 3e-4`, `iter 10: loss 2.3100, time 12.0ms, mfu 3.2%`,
  `Step 10/100 | Loss: 2.31`, a printed tensor `loss tensor(2.3100, grad_fn=...)`), behind a
  logging prefix or none (`INFO:root:`, `2026-12-04 10:00:00,123 INFO name:`, `[rank0]:`): the
  pairs are found wherever they are.
- Lines with a training loss and no step (not indented: that continues another line): each is
  the next step, or the bar's step when a bar is drawn.

A line that reports an evaluation (`val loss`, `eval_loss`, `test acc`) is not a training step.
"""

from __future__ import annotations

import re

from trainroom.core.logs.loglines import (
    _EPOCH,
    BAR_COUNT,
    LOG_LINES,
    LOSS_KEYS,
    LR_KEYS,
    PRINTED_STEPS,
    LogStep,
    Recogniser,
    metrics,
    number,
    pick,
    tqdm_bar,
)

# `[train ]key[ =|: ]value`: a qualifier word before the key (`val loss 2.5`) belongs to it.
# Linear: a key starts only where no name character is before it and is taken whole (possessive,
# at most 64 characters: each start costs at most that), the spaces around the separator are one
# possessive run, the digits are capped.
_PAIR = re.compile(
    r"(?<![\w.])(?P<qual>(?:train|training|val|valid|validation|eval|evaluation|test)[ \t]++)?"
    r"(?P<key>[A-Za-z_][\w/.-]{0,63}+)(?:\s*+[=:]\s*+|\s++)(?:tensor\()?"
    r"(?P<value>[-+]?(?:\d{1,24}+(?:\.\d{0,24}+)?|\.\d{1,24}+)(?:[eE][-+]?\d{1,4}+)?|nan|inf)(?![\d.])",
    re.I,
)
_RICH_BAR = "━╸╺"
STEP_KEYS = ("step", "global_step", "iter", "iteration", "train_step", "update")
GRAD_KEYS = ("grad_norm", "gnorm", "grad-norm", "gradnorm")
_EVAL_KEY = re.compile(r"^(?:val|valid|validation|eval|evaluation|test)(?:$|[_/ .-])")
# Bars that are not training: datasets, downloads, checkpoint shards, evaluation.
_OTHER_BAR = re.compile(
    r"sanity|valid|\bval\b|eval|test|predict|load|download|upload|map|shard|token|filter|"
    r"generat|extract|fetch|resolv|saving|writing|index",
    re.I,
)


def pairs(line: str) -> dict[str, float]:
    """The line's numeric pairs by lower-case key (a qualifier joined on: `val_loss`); the first
    of each key is kept (`train loss 2.3, val loss 2.5` has both)."""
    out: dict[str, float] = {}
    for m in _PAIR.finditer(line):
        value = number(m.group("value"))
        if value is None:
            continue
        key = m.group("key").lower()
        if m.group("qual"):
            key = m.group("qual").strip().lower() + "_" + key
        out.setdefault(key, value)
    return out


class PlainLoop(Recogniser):
    """A hand-written loop's tqdm bar and printed or logged lines (see the module's words)."""

    def __init__(self) -> None:
        # What gives the step, once seen: "bar" or "lines" (kept across attempts: the same loop).
        self.stepper: str | None = None
        self.restart()

    @property
    def name(self) -> str:  # type: ignore[override]
        return "tqdm" if self.stepper == "bar" else "lines"

    @property
    def unit(self) -> str:  # type: ignore[override]
        return {"bar": BAR_COUNT, "lines": PRINTED_STEPS}.get(self.stepper or "", LOG_LINES)

    def restart(self) -> None:
        self.bar_key: tuple[str, int | None] | None = None  # the followed bar: (its desc less digits, total)
        self.bar_n = 0
        self.base = 0  # the counts of the bars (epochs) already ended
        self.emitted = -1
        self.counted = 0

    # ------------------------------------------------------------------ bars

    def _bar(self, line: str) -> tuple[int, dict[str, float]] | None:
        """A bar of the followed kind as (step, postfix metrics); None for any other line."""
        m = tqdm_bar(line)
        if m is None:
            return None
        desc = m.desc.strip().rstrip(":").strip()
        if _EPOCH.match(m.desc.strip()) or (desc and _OTHER_BAR.search(desc[:256])):
            return None
        n, total = m.n, m.total
        key = (re.sub(r"\d+", "#", desc), total)
        if self.bar_key is None:
            if n == 0:
                return None
            self.bar_key = key
        if key != self.bar_key:
            return None
        if n < self.bar_n:
            self.base += total if total is not None else self.bar_n  # the bar restarted: the next epoch
        self.bar_n = n
        return self.base + n, metrics(m.rest)

    def _from_bar(self, line: str) -> list[LogStep]:
        got = self._bar(line)
        if got is None:
            return []
        if self.stepper == "lines":
            return []  # the printed steps are the step; the bar only draws
        step, values = got
        if step <= self.emitted:
            return []
        self.stepper, self.emitted = "bar", step
        return [_step(step, values)]

    # ------------------------------------------------------------------ lines

    def feed(self, line: str) -> list[LogStep]:
        if "%|" in line and tqdm_bar(line) is not None:
            return self._from_bar(line)
        if any(c in line for c in _RICH_BAR):
            return []  # a Rich bar (Lightning's): its metrics are the bar's reader's
        values = pairs(line)
        if not values or any(_EVAL_KEY.match(k) for k in values):
            return []
        s = _step(0, values)
        if s.loss is None and s.lr is None and s.grad_norm is None:
            return []
        own = pick(values, STEP_KEYS)
        if own is not None and own >= 0 and own == int(own):
            self.stepper = "lines"
            self.emitted = int(own)
            return [_replace(s, int(own))]
        if s.loss is None or self.stepper == "lines" or line[:1].isspace():
            return []  # (an indented line continues another's: Rich wraps Lightning's metrics)
        if self.stepper == "bar":
            return [_replace(s, self.emitted)]  # the loss of the step the bar drew last
        self.counted += 1
        return [_replace(s, self.counted)]

    def peek(self, line: str) -> list[LogStep]:
        # A bar's last redraw has no line end until the next one; a whole one ends in `]`.
        return self._from_bar(line) if line.rstrip().endswith("]") else []


def _step(step: int, values: dict[str, float]) -> LogStep:
    return LogStep(
        step, pick(values, LOSS_KEYS, suffix="loss"), pick(values, LR_KEYS), pick(values, GRAD_KEYS)
    )


def _replace(s: LogStep, step: int) -> LogStep:
    return LogStep(step, s.loss, s.lr, s.grad_norm)
