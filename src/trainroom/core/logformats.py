"""Log-line telemetry for an uninstrumented trainer: recognisers that read steps, loss, LR and grad
norm from what the common trainers print, with no configuration.

The keeper's log reader (keeper/logtail) cuts trainer.log into lines on `\\n` and `\\r` (a tqdm bar
redraws itself with `\\r`) and hands each line to a `Recognition`: the built-in recognisers are
tried in order until one reads a step, and that one is kept for the run. Built in:

- `hf`: Hugging Face `Trainer`. Its logged dicts (`{'loss': 2.3, 'grad_norm': 0.9,
  'learning_rate': 5e-05, 'epoch': 0.5}`; transformers 5 prints the values as strings) carry no
  step: the step is the training bar's count drawn right after the dict (tqdm.write redraws the
  bar at once; the bar drawn before it can be several steps stale), or, with no bar, the dicts
  are counted. The bar alone (`45%|...| 45/100 [`) moves the step between dicts.
- `lightning`: PyTorch Lightning's TQDM (`Epoch 1:  45%|...| 18/40 [..., train_loss=2.3]`) and Rich
  (`Epoch 1/9 ━━━ 18/40 0:00:01 • ... train_loss: 2.3`) bars; the step is epoch x batches + n.
- `nanogpt`: `iter 100: loss 2.3456, time ...`.

A user's pattern (`--log-pattern`, trainroom.toml's `[log] pattern`) replaces them all: named
groups `step`, `loss`, `lr`, `grad_norm`; without a `step` group each matching line is a step.
"""

from __future__ import annotations

import ast
import re

import msgspec

NANOGPT_PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))"
# A logged dict longer than this is not a step's few numbers (literal_eval must stay cheap).
MAX_DICT_CHARS = 4096
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf)$", re.I)
# tqdm's bar: `[desc: ]NN%|bar| n/total [elapsed<left, rate, postfix]`.
_TQDM = re.compile(r"^(?P<desc>.*?)\s*\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<rest>[^\]]*)")
# Rich's bar as Lightning lays it out: `Epoch 3/9 ━━━╸━━ 18/40 0:00:01 • 0:00:02 12.3it/s metrics`.
_RICH = re.compile(r"^Epoch (?P<epoch>\d+)(?:/-?\d+)?\s+[━╸╺─ ]+\s+(?P<n>\d+)/(?P<total>\d+)\s+(?P<rest>.*)$")
_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+):?$")
# `name=value` (tqdm postfix) or `name: value` (Rich metrics).
_METRIC = re.compile(r"(?P<key>[A-Za-z_][\w/.-]*)\s*(?:=|:\s)\s*(?P<value>[-+]?[\w.]+)")
LOSS_KEYS = ("loss", "train_loss", "train_loss_step", "loss_step", "training_loss")
LR_KEYS = ("learning_rate", "lr")


class LogStep(msgspec.Struct, frozen=True):
    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None


def number(value: object) -> float | None:
    """A logged value as a float: a number, or a string that spells one (transformers 5 logs
    `'loss': '3.919'`); None for anything else. nan and inf are kept: a diverged loss is news."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return float(value)
    return None


def pick(values: dict[str, float], keys: tuple[str, ...], suffix: str | None = None) -> float | None:
    """The first of `keys` present; else (with `suffix`) a training key ending in it."""
    for k in keys:
        if k in values:
            return values[k]
    if suffix is not None:
        for k, v in values.items():
            low = k.lower()
            if low.endswith((suffix, suffix + "_step")) and not low.startswith(("val", "eval", "test")):
                return v
    return None


def metrics(text: str) -> dict[str, float]:
    """`a=1.5, b=2` or `a: 1.5 b: 2` as numbers (what is not a number is left out)."""
    out: dict[str, float] = {}
    for m in _METRIC.finditer(text):
        v = number(m.group("value"))
        if v is not None:
            out[m.group("key")] = v
    return out


class Recogniser:
    """Reads steps from lines. `feed` takes one whole line; `peek` the unfinished last line (it
    may be fed again once finished, so peeking never consumes it); `end` says the attempt ended
    (emit what was held back); `restart` forgets the attempt's counts."""

    name = "?"

    def feed(self, line: str) -> list[LogStep]:
        raise NotImplementedError

    def peek(self, line: str) -> list[LogStep]:
        return []

    def end(self) -> list[LogStep]:
        return []

    def restart(self) -> None:
        return None


class PatternLog(Recogniser):
    """A regular expression with named groups `step`, `loss`, `lr`, `grad_norm`; without `step`,
    each matching line is the next step."""

    def __init__(self, pattern: str, name: str = "pattern") -> None:
        self.regex = re.compile(pattern)
        self.name = name
        self.counted = "step" not in self.regex.groupindex
        self.count = 0

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

    name = "hf"

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.total: int | None = None  # the training bar's total (an eval bar has another)
        self.bar: int | None = None
        self.emitted = -1
        self.pending: LogStep | None = None  # a dict waiting for the bar that gives its step
        self.dicts = 0

    def _bar(self, line: str) -> int | None:
        m = _TQDM.match(line)
        if m is None or m.group("desc").strip():
            return None  # a described bar is someone else's (checkpoint shards, Lightning)
        total = int(m.group("total"))
        if self.total is None:
            self.total = total
        return int(m.group("n")) if total == self.total else None

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
        self.dicts += 1
        held = LogStep(self.dicts, values["loss"], pick(values, LR_KEYS), values.get("grad_norm"))
        out = self.end() if self.pending is not None else []
        if self.total is None:
            return [*out, held]  # no bar at all (disable_tqdm): the dicts are counted
        self.pending = held
        return out


class LightningBar(Recogniser):
    """PyTorch Lightning's training bar, TQDM or Rich. TQDM draws each batch twice (the count,
    then the metrics of that batch), so a step is emitted once the bar moves past it, or at the
    end; Rich may wrap the metrics onto a second line."""

    name = "lightning"

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.batches = 0  # the largest per-epoch total seen: an epoch's length
        self.pending: LogStep | None = None
        self.emitted = 0
        self.attach = False  # the last bar drawn is the held step's: a wrapped metric line is its

    def _parse(self, line: str) -> tuple[int, int, int, dict[str, float]] | None:
        m = _TQDM.match(line)
        if m is not None:
            e = _EPOCH.match(m.group("desc").strip())
            if e is None:
                return None  # validation, sanity checking, someone else's bar
            epoch, rest = int(e.group("epoch")), m.group("rest")
        else:
            m = _RICH.match(line.strip())
            if m is None:
                return None
            epoch, rest = int(m.group("epoch")), m.group("rest")
        return epoch, int(m.group("n")), int(m.group("total")), metrics(rest)

    def _step(self, line: str) -> LogStep | None:
        parsed = self._parse(line)
        if parsed is None:
            return None
        epoch, n, total, values = parsed
        self.batches = max(self.batches, total)
        self.attach = n > 0
        if n == 0:
            return None  # a bar reset at an epoch's start: nothing new has stepped
        loss = pick(values, LOSS_KEYS, suffix="loss")
        return LogStep(epoch * self.batches + n, loss, pick(values, LR_KEYS), values.get("grad_norm"))

    def feed(self, line: str) -> list[LogStep]:
        s = self._step(line)
        if s is None:
            return self._continuation(line)
        if s.step < self.emitted:
            return []  # a stale redraw (the bar is never behind the steps already read)
        out: list[LogStep] = []
        if self.pending is not None and self.pending.step != s.step:
            out = self.end()
        elif self.pending is not None and s.loss is None:
            s = msgspec.structs.replace(s, loss=self.pending.loss)  # a redraw without the metrics
        self.pending = s
        return out

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


def builtin() -> list[Recogniser]:
    """The recognisers tried, in order, when the run names no pattern of its own."""
    return [HfTrainerLog(), LightningBar(), PatternLog(NANOGPT_PATTERN, name="nanogpt")]


class Recognition:
    """Tries its recognisers in order until one reads a step, then keeps that one. A recogniser
    that raises on a line costs that line only: the error is counted and reading goes on."""

    def __init__(self, recognisers: list[Recogniser]) -> None:
        self.candidates = recognisers
        self.chosen: Recogniser | None = recognisers[0] if len(recognisers) == 1 else None
        self.errors = 0
        self.last_error: str | None = None

    @property
    def name(self) -> str | None:
        return self.chosen.name if self.chosen is not None else None

    def _call(self, r: Recogniser, method: str, *args: str) -> list[LogStep]:
        try:
            out: list[LogStep] = getattr(r, method)(*args)
        except Exception as exc:  # a recogniser must never stop the reader
            self.errors += 1
            self.last_error = f"{r.name}.{method}: {type(exc).__name__}: {exc}"[:500]
            return []
        return [s for s in out if s.step >= 0]

    def _each(self, method: str, *args: str) -> list[LogStep]:
        if self.chosen is not None:
            return self._call(self.chosen, method, *args)
        for r in self.candidates:
            out = self._call(r, method, *args)
            if out:
                self.chosen = r
                return out
        return []

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


def recognition(pattern: str | None) -> Recognition:
    """The run's pattern alone when it names one, else the built-in recognisers."""
    return Recognition([PatternLog(pattern)] if pattern else builtin())
