"""Log-line telemetry for an uninstrumented trainer: recognisers that read steps, loss, LR and grad
norm from what the common trainers print, with no configuration.

The keeper's log reader (keeper/logtail) cuts trainer.log into lines on `\\n` and `\\r` (a tqdm bar
redraws itself with `\\r`) and hands each line to a `Recognition`: the built-in recognisers are
tried in order until one reads a step, and that one is kept for the run. Built in:

- `hf`: Hugging Face `Trainer`. Its logged dicts (`{'loss': 2.3, 'grad_norm': 0.9,
  'learning_rate': 5e-05, 'epoch': 0.5}`; transformers 5 prints the values as strings) carry no
  step: the step is the training bar's count drawn right after the dict (tqdm.write redraws the
  bar at once; the bar drawn before it can be several steps stale). The bar alone (`45%|...|
  45/100 [`) moves the step between dicts. Both count optimizer steps; until a dict comes, a
  bare bar could be any loop's and is named `tqdm`, its unit the bar count. With no bar
  (`disable_tqdm`) a dict's own `step`/`global_step` is its step; else the dicts are counted and,
  when the command says its `logging_steps` (LogHints), multiplied by it; else the unit is said:
  logged dicts, not steps.
- `lightning`: PyTorch Lightning's TQDM (`Epoch 1:  45%|...| 18/40 [..., train_loss=2.3]`) and Rich
  (`Epoch 1/9 ━━━ 18/40 0:00:01 • ... train_loss: 2.3`) bars. The bar counts batches: with
  `accumulate_grad_batches` known (LogHints) they become optimizer steps, else the unit is batches.
- `nanogpt`: `iter 100: loss 2.3456, time ...` (optimizer steps).
- `tqdm` and `lines`: plain loops (core/logs/logshapes): tqdm bars with or without a description or a
  postfix, and printed or logged lines of `step`/`iter` with a loss or LR.

Until the recogniser kept has read a loss, the others go on reading: one that reads a loss takes
over (a bare bar is read as HF's until a plain loop's loss lines show it is not).

A user's pattern (`--log-pattern`, trainroom.toml's `[log] pattern`) replaces them all: named
groups `step`, `loss`, `lr`, `grad_norm`; without a `step` group each matching line is a step.
"""

from __future__ import annotations

import ast
import re

import msgspec

from trainroom.core.logs.loglines import (
    _EPOCH,
    BAR_COUNT,
    BATCHES,
    LOG_LINES,
    LOGGED_DICTS,
    LOSS_KEYS,
    LR_KEYS,
    OPTIMIZER_STEPS,
    PRINTED_STEPS,
    LogHints,
    LogStep,
    Recogniser,
    metrics,
    number,
    pick,
    tqdm_bar,
)
from trainroom.core.logs.logshapes import PlainLoop

# The primitives live in core/logs/loglines; the rest of trainroom reads them from here too.
__all__ = [
    "ANSI",
    "NANOGPT_PATTERN",
    "HfTrainerLog",
    "LightningBar",
    "LogHints",
    "LogStep",
    "PatternLog",
    "PlainLoop",
    "Recogniser",
    "Recognition",
    "builtin",
    "number",
    "recognition",
]

NANOGPT_PATTERN = r"iter (?P<step>\d{1,18}+): loss (?P<loss>[-+]?(?:\d{1,24}+(?:\.\d{0,24}+)?(?:[eE][-+]?\d{1,4}+)?|nan|inf))"
# A logged dict longer than this is not a step's few numbers (literal_eval must stay cheap).
MAX_DICT_CHARS = 4096
ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}+[A-Za-z]")
# Rich's bar as Lightning lays it out: `Epoch 3/9 ━━━╸━━ 18/40 0:00:01 • 0:00:02 12.3it/s metrics`.
# Linear: the bar and the spaces around it are one possessive run (checked for a glyph after).
_RICH = re.compile(
    r"^Epoch (?P<epoch>\d{1,9}+)(?:/-?\d{1,9}+)?(?P<bar>[━╸╺─\s]++)(?P<n>\d{1,18}+)/(?P<total>\d{1,18}+)\s(?P<rest>.*)$"
)
_RICH_GLYPHS = "━╸╺─"
_AFTER_STOP = (-1, -1)
# Lightning's own word that the run ended at max_steps.
_MAX_STEPS = re.compile(r"`Trainer\.fit` stopped: `max_steps=(?P<n>\d{1,18}+)` reached")


class PatternLog(Recogniser):
    """A regular expression with named groups `step`, `loss`, `lr`, `grad_norm`; without `step`,
    each matching line is the next step."""

    def __init__(self, pattern: str, name: str = "pattern") -> None:
        self.regex = re.compile(pattern)
        self.name = name
        self.counted = "step" not in self.regex.groupindex
        self.count = 0
        self.unit = LOG_LINES if self.counted else PRINTED_STEPS

    def feed(self, line: str) -> list[LogStep]:
        m = self.regex.search(line)
        if m is None:
            return []
        g = m.groupdict()
        if self.counted:
            step = self.count + 1
        else:
            try:
                step = int(g["step"])
            except (TypeError, ValueError):
                return []
        self.count = step
        return [LogStep(step, number(g.get("loss")), number(g.get("lr")), number(g.get("grad_norm")))]

    def restart(self) -> None:
        self.count = 0


class HfTrainerLog(Recogniser):
    """Hugging Face `Trainer`: logged dicts, stepped by the training bar drawn after them."""

    def __init__(self, hints: LogHints | None = None) -> None:
        self.every = hints.logging_steps if hints is not None else None
        # What was seen, kept across attempts (the same trainer): a dict with its own step, a
        # training bar, a logged dict. A bar with no dict yet is any loop's bare bar.
        self.stepped = self.barred = self.logged = False
        self.restart()

    @property
    def name(self) -> str:  # type: ignore[override]
        return "hf" if self.logged else "tqdm"

    @property
    def unit(self) -> str:  # type: ignore[override]
        if self.barred:
            return OPTIMIZER_STEPS if self.logged else BAR_COUNT
        return OPTIMIZER_STEPS if self.stepped or self.every else LOGGED_DICTS

    def restart(self) -> None:
        self.total: int | None = None  # the training bar's total (an eval bar has another)
        self.bar: int | None = None
        self.emitted = -1
        self.pending: LogStep | None = None  # a dict waiting for the bar that gives its step
        self.dicts = 0

    def _bar(self, line: str) -> int | None:
        m = tqdm_bar(line)
        if m is None or m.desc.strip():
            return None  # a described bar is someone else's (checkpoint shards, Lightning)
        if pick(metrics(m.rest), LOSS_KEYS, suffix="loss") is not None:
            return None  # the Trainer's bar has no postfix: a loss there is a plain loop's
        total = m.total
        if total is None:
            return None  # the Trainer's bar knows its total (max_steps)
        if self.total is None:
            self.total, self.barred = total, True
        return m.n if total == self.total else None

    def feed(self, line: str) -> list[LogStep]:
        text = line.strip()
        if text.startswith("{") and text.endswith("}"):
            return self._dict(text)
        n = self._bar(line)
        if n is None:
            return []
        out = self._resolve(n)
        if n > self.emitted:
            self.emitted = n
            if not out and n > 0:  # 0/N: the loop has not stepped yet
                out.append(LogStep(n))
        self.bar = n
        return out

    def peek(self, line: str) -> list[LogStep]:
        # The bar tqdm.write redraws after a dict has no line end until the next redraw.
        n = self._bar(line) if self.pending is not None else None
        return self._resolve(n) if n is not None else []

    def end(self) -> list[LogStep]:
        # No bar came after the last dict: the last bar is the best lower bound there is.
        held, self.pending = self.pending, None
        if held is None:
            return []
        step = max(self.bar or 0, self.emitted, 0)
        return [msgspec.structs.replace(held, step=step)]

    def _resolve(self, n: int) -> list[LogStep]:
        held, self.pending = self.pending, None
        if held is None:
            return []
        self.emitted = max(self.emitted, n)
        return [msgspec.structs.replace(held, step=n)]

    def _dict(self, text: str) -> list[LogStep]:
        if len(text) > MAX_DICT_CHARS or "loss" not in text:
            return []
        try:
            raw = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return []
        if not isinstance(raw, dict):
            return []
        values = {str(k): v for k, x in raw.items() if (v := number(x)) is not None}
        if "loss" not in values:
            return []  # eval and end-of-training summaries: no training step
        self.dicts, self.logged = self.dicts + 1, True
        own = pick(values, ("step", "global_step"))
        if own is not None and own >= 0 and own == int(own):
            self.stepped, step = True, int(own)
        else:
            step = self.dicts * (self.every or 1)
        held = LogStep(step, values["loss"], pick(values, LR_KEYS), values.get("grad_norm"))
        out = self.end() if self.pending is not None else []
        if self.total is None:
            # No bar at all (disable_tqdm): the dict's own step, or the dicts counted (times
            # logging_steps when the command says it).
            return [*out, held]
        self.pending = held
        return out


class LightningBar(Recogniser):
    """PyTorch Lightning's training bar, TQDM or Rich. TQDM draws each batch twice (the count,
    then the metrics of that batch), so a step is emitted once the bar moves past it, or at the
    end; Rich may wrap the metrics onto a second line."""

    name = "lightning"

    def __init__(self, hints: LogHints | None = None) -> None:
        self.accumulate = hints.accumulate if hints is not None else None
        self.unit = OPTIMIZER_STEPS if self.accumulate else BATCHES
        self.restart()

    def rate_scale(self) -> float:
        return 1.0 / self.accumulate if self.accumulate else 1.0

    def restart(self) -> None:
        self.epoch: int | None = None  # the epoch the last bar drew
        self.epoch_end = 0  # its length so far: the largest count drawn
        self.epoch_total: int | None = None  # the total its bar drew (None: `n/?`)
        self.base = 0  # the optimizer steps of the epochs before it
        self.final: int | None = None  # `max_steps=N` reached: the step the run ended at
        self.pending: LogStep | None = None
        self.n: tuple[int, int] = (0, 0)  # the (epoch, batch) the last bar drew
        self.pending_n = self.n  # the batch the held step was read at
        self.emitted = 0
        self.attach = False  # the last bar drawn is the held step's: a wrapped metric line is its

    def _parse(self, line: str) -> tuple[int, int, int | None, dict[str, float]] | None:
        b = tqdm_bar(line)
        if b is not None:
            e = _EPOCH.match(b.desc.strip())
            if e is None:
                return None  # validation, sanity checking, someone else's bar
            return int(e.group("epoch")), b.n, b.total, metrics(b.rest)
        m = _RICH.match(line.strip())
        bar = m.group("bar") if m is not None else ""
        if m is None or not (
            bar[:1].isspace() and bar[-1:].isspace() and any(c in bar for c in _RICH_GLYPHS)
        ):
            return None
        return int(m.group("epoch")), int(m.group("n")), int(m.group("total")), metrics(m.group("rest"))

    def _ended_length(self, new_total: int | None) -> int:
        """The length of the epoch that just ended. Rich may never draw an epoch's last frames
        (`39/40`, then `1/40`), so the totals decide where they can: a bar's total is the epoch's
        length (a sized loader; the last epoch under `max_steps` shows only the steps left), or,
        for an iterable under `max_steps`, the steps left (90, 50, 10: the epoch is the
        difference). Of the two, the smaller one the drawn count does not exceed; without totals,
        the largest count drawn."""
        old = self.epoch_total
        if old is None or new_total is None:
            return self.epoch_end
        fits = [n for n in (old - new_total, old) if n >= self.epoch_end]
        return min(fits) if fits else self.epoch_end

    def _step(self, line: str) -> LogStep | None:
        parsed = self._parse(line)
        if parsed is None:
            return None
        epoch, n, total, values = parsed
        acc = self.accumulate or 1
        if epoch != self.epoch:
            # Each epoch's steps are counted from where the one before ended: the largest count
            # its bar drew (Lightning draws each batch; under max_steps an iterable's total is the
            # steps left, not the epoch's length, and an unsized one is `n/?`).
            if self.epoch is not None and epoch > self.epoch:
                self.base += (epoch - self.epoch) * -(-self._ended_length(total) // acc)
            elif self.epoch is None:
                self.base = epoch * -(-(total or n) // acc)  # first seen mid-run: a resume
            self.epoch, self.epoch_end = epoch, 0
        self.epoch_total = total
        self.epoch_end = max(self.epoch_end, n)
        self.attach = n > 0
        self.n = (epoch, n)
        # Lightning steps the optimizer every `acc` batches and once more on an epoch's last
        # batch when the epoch does not divide evenly.
        within = n // acc + (1 if n == total and n % acc else 0)
        if within == 0:
            return None  # a bar reset at an epoch's start: nothing new has stepped
        loss = pick(values, LOSS_KEYS, suffix="loss")
        step = self.base + within
        if self.final is not None:
            step = max(step, self.final)
        return LogStep(step, loss, pick(values, LR_KEYS), values.get("grad_norm"))

    def feed(self, line: str) -> list[LogStep]:
        at = line.find("`Trainer.fit` stopped: `max_steps=")  # its own line, or after the bar's last redraw
        stopped = _MAX_STEPS.match(line, at) if at >= 0 else None
        if stopped is not None:
            before = self.feed(line[:at]) if at > 0 else []
            return before + self._stopped(int(stopped.group("n")))
        s = self._step(line)
        if s is None:
            return self._continuation(line)
        if s.step < self.emitted:
            return []  # a stale redraw (the bar is never behind the steps already read)
        out: list[LogStep] = []
        n = self.n
        if self.pending is not None and self.pending.step != s.step:
            out = self.end()
        elif self.pending is not None and n != self.pending_n and self.pending_n != _AFTER_STOP:
            return []  # the next micro-batch of the same optimizer step: the step's is kept
        elif self.pending is not None and s.loss is None:
            s = msgspec.structs.replace(s, loss=self.pending.loss)  # a redraw without the metrics
        self.pending, self.pending_n = s, n
        return out

    def _stopped(self, n: int) -> list[LogStep]:
        """`Trainer.fit` stopped: `max_steps=N` reached.`: the run's last step is N (a Rich bar,
        drawn only at the end, and a bar whose total was the steps left say less)."""
        self.final = n
        if self.pending is None or self.pending.step < n:
            held = self.end() if self.pending is not None and self.pending.step < n else []
            self.pending = LogStep(n)
            self.pending_n = _AFTER_STOP  # the next bar's metrics are this step's
            return held
        return []

    def _continuation(self, line: str) -> list[LogStep]:
        """Rich wraps the metrics onto a line of their own under the bar."""
        if self.pending is None or not self.attach or not line[:1].isspace():
            return []
        values = metrics(line)
        loss = pick(values, LOSS_KEYS, suffix="loss")
        if loss is not None:
            self.pending = msgspec.structs.replace(self.pending, loss=loss)
        return []

    def peek(self, line: str) -> list[LogStep]:
        s = self._step(line)
        if s is None or self.pending is None or s.step == self.pending.step:
            return []
        return self.end()

    def end(self) -> list[LogStep]:
        held, self.pending = self.pending, None
        if held is None:
            return []
        self.emitted = held.step
        return [held]


def builtin(hints: LogHints | None = None) -> list[Recogniser]:
    """The recognisers tried, in order, when the run names no pattern of its own."""
    nanogpt = PatternLog(NANOGPT_PATTERN, name="nanogpt")
    nanogpt.unit = OPTIMIZER_STEPS  # iter_num counts optimizer steps (accumulation is inside one)
    return [HfTrainerLog(hints), LightningBar(hints), nanogpt, PlainLoop()]


class Recognition:
    """Tries its recognisers in order until one reads a step, then keeps that one. Until the one
    kept has read a loss, all are fed each line and one that reads a loss takes over (the first
    that does, in order). A recogniser that raises on a line costs that line only: the error is
    counted and reading goes on."""

    def __init__(self, recognisers: list[Recogniser]) -> None:
        self.candidates = recognisers
        self.chosen: Recogniser | None = recognisers[0] if len(recognisers) == 1 else None
        self.settled = self.chosen is not None  # the one kept read a loss: the others stop
        self.errors = 0
        self.last_error: str | None = None

    @property
    def name(self) -> str | None:
        return self.chosen.name if self.chosen is not None else None

    @property
    def unit(self) -> str | None:
        """What the kept recogniser's steps count (None before one read a step)."""
        return self.chosen.unit if self.chosen is not None else None

    def _call(self, r: Recogniser, method: str, *args: str) -> list[LogStep]:
        try:
            out: list[LogStep] = getattr(r, method)(*args)
        except Exception as exc:  # a recogniser must never stop the reader
            self.errors += 1
            self.last_error = f"{r.name}.{method}: {type(exc).__name__}: {exc}"[:500]
            return []
        return [s for s in out if s.step >= 0]

    def _each(self, method: str, *args: str) -> list[LogStep]:
        if self.chosen is not None and self.settled:
            return self._call(self.chosen, method, *args)
        outs = [(r, self._call(r, method, *args)) for r in self.candidates]
        with_loss = [r for r, out in outs if any(s.loss is not None for s in out)]
        mine = [out for r, out in outs if r is self.chosen]
        if with_loss and not any(s.loss is not None for s in (mine[0] if mine else [])):
            self.chosen = with_loss[0]
        elif self.chosen is None:
            self.chosen = next((r for r, out in outs if out), None)
        out = next((out for r, out in outs if r is self.chosen), [])
        self.settled = any(s.loss is not None for s in out)
        return out

    def feed(self, line: str) -> list[LogStep]:
        return self._each("feed", ANSI.sub("", line))

    def peek(self, line: str) -> list[LogStep]:
        return self._each("peek", ANSI.sub("", line))

    def end(self) -> list[LogStep]:
        out = self._each("end")
        for r in self.candidates:
            try:
                r.restart()
            except Exception as exc:  # as in _call: never stop the reader
                self.errors += 1
                self.last_error = f"{r.name}.restart: {type(exc).__name__}: {exc}"[:500]
        return out


def recognition(pattern: str | None, hints: LogHints | None = None) -> Recognition:
    """The run's pattern alone when it names one, else the built-in recognisers."""
    return Recognition([PatternLog(pattern)] if pattern else builtin(hints))
