"""What the log recognisers (core/logformats, core/logshapes) share: the step they read, the
parsers of tqdm bars and `name=value` metrics, the units a step may count, and the hints a
command gives about them."""

from __future__ import annotations

import re

import msgspec

_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf)$", re.I)
# tqdm's bar: `[desc: ]NN%|bar| n/total [elapsed<left, rate, postfix]`.
_TQDM = re.compile(r"^(?P<desc>.*?)\s*\d+%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*\[(?P<rest>[^\]]*)")
_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+):?$")
# `name=value` (tqdm postfix) or `name: value` (Rich metrics).
_METRIC = re.compile(r"(?P<key>[A-Za-z_][\w/.-]*)\s*(?:=|:\s)\s*(?P<value>[-+]?[\w.]+)")
LOSS_KEYS = ("loss", "train_loss", "train_loss_step", "loss_step", "training_loss")
LR_KEYS = ("learning_rate", "lr")
# What a recogniser's step counts. Only optimizer steps (and a plain loop's own printed step, which
# is what its checkpoints are numbered by) compare with a checkpoint's step.
OPTIMIZER_STEPS = "optimizer steps"
BATCHES = "batches"
LOGGED_DICTS = "logged dicts"
PRINTED_STEPS = "printed steps"
BAR_COUNT = "bar count"
LOG_LINES = "log lines"
NOT_STEPS = (BATCHES, LOGGED_DICTS, LOG_LINES)


def unread_words(lines: int) -> str:
    """What a run whose log was read with nothing recognised is told."""
    return f"log read but no step or loss recognised in {lines} lines: pass --log-pattern"


def step_words(step: int, unit: str | None) -> str:
    """`step 740`, or the count in its own unit when that is not optimizer steps: `batch 720 (the
    log counts batches, not optimizer steps)`."""
    one = {BATCHES: "batch", LOGGED_DICTS: "logged dict", LOG_LINES: "log line"}.get(unit or "")
    if one is None:
        return f"step {step}"
    return f"{one} {step} (the log counts {unit}, not optimizer steps)"


class LogHints(msgspec.Struct, frozen=True, kw_only=True):
    """What the command or its script says about how its log counts (core/frameworks): None is
    not known."""

    logging_steps: int | None = None  # HF Trainer: a dict every N optimizer steps
    accumulate: int | None = None  # Lightning: batches per optimizer step
    evidence: str = ""  # where they were read, in words


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
    unit = PRINTED_STEPS  # what its steps count (OPTIMIZER_STEPS, BATCHES, ...)

    def feed(self, line: str) -> list[LogStep]:
        raise NotImplementedError

    def peek(self, line: str) -> list[LogStep]:
        return []

    def end(self) -> list[LogStep]:
        return []

    def restart(self) -> None:
        return None
