"""What the log recognisers (core/logs/logformats, core/logs/logshapes) share: the step they read, the
parsers of tqdm bars and `name=value` metrics, the units a step may count, and the hints a
command gives about them.

Trainer output is hostile data: every pattern here runs in time linear in the line (no nested or
adjacent overlapping quantifiers, each repetition capped, a bar found by `str.find` rather than a
leading `.*?`), and the keeper's reader hands a recogniser at most PARSE_CHARS of a line
(keeper/logtail). scripts/bench_patterns.py times each one on 1 KiB to 1 MiB hostile lines."""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec

from trainroom.core.vocab import RateSource

# What of one line a recogniser reads: the rest of a longer line is skipped (and counted).
PARSE_CHARS = 4096
# A number's digits are capped: a count or a figure with more is not one a trainer means (and
# `int()` refuses strings over 4300 digits).
DIGITS = 24
_NUMBER = re.compile(
    r"^[-+]?(?:\d{1,24}+(?:\.\d{0,24}+)?|\.\d{1,24}+)(?:[eE][-+]?\d{1,4}+)?$|^[-+]?(?:nan|inf)$", re.I
)
# tqdm's bar: `[desc: ]NN%|bar| n/total [elapsed<left, rate, postfix]`, found from its `%|`.
_BAR_COUNT = re.compile(r"(?<!\s)\s*+(?P<n>\d{1,18}+)/(?P<total>\d{1,18}+|\?)\s*+\[(?P<rest>[^\]]{0,4096}+)")
_EPOCH = re.compile(r"^Epoch (?P<epoch>\d{1,9}):?$")
# `name=value` (tqdm postfix) or `name: value` (Rich metrics), read token by token: a run of name
# characters, a run of spaces, or one other character (each token consumed once: linear).
_TOKEN = re.compile(r"[\w/.-]++|\s++|.", re.S)
_KEY_START = re.compile(r"[A-Za-z_]")
_KEY_CHARS = 128
# A value: a run of word characters and dots (an exponent's sign kept: `3e-4`), capped.
_VALUE = re.compile(r"(?<![\w.+-])[-+]?[\w.]{1,64}+(?:(?<=[eE])[-+]\d{1,4}+)?(?![\w.])")


class Bar(NamedTuple):
    """A tqdm bar's parts: its description (before the percentage), count, total (None: `n/?`,
    not known) and the text in its brackets (elapsed, rate, postfix)."""

    desc: str
    n: int
    total: int | None
    rest: str


def tqdm_bar(line: str) -> Bar | None:
    """The first tqdm bar in `line` (`desc NN%|bar| n/total [rest`), or None. Linear: each `%|`
    is found by `str.find`, the bar's body ends at the next `|`, the count is matched there."""
    start = 0
    for _ in range(8):  # a line with more `%|` than a bar has is not a bar
        j = line.find("%|", start)
        if j < 0:
            return _unsized_bar(line) if start == 0 else None
        k = j
        while k > 0 and line[k - 1].isdigit() and j - k < 3:
            k -= 1
        close = line.find("|", j + 2)
        if close < 0:
            return None
        m = _BAR_COUNT.match(line, close + 1)
        if k < j and m is not None:
            total = int(m["total"]) if m["total"] != "?" else None
            return Bar(line[:k].rstrip(), int(m["n"]), total, m["rest"])
        start = j + 2
    return None


def _unsized_bar(line: str) -> Bar | None:
    """A bar whose total is not known draws no percentage: `Epoch 1: |   | 175/? [...`."""
    j = line.find(": |")
    close = line.find("|", j + 3) if j >= 0 else -1
    m = _BAR_COUNT.match(line, close + 1) if close >= 0 else None
    if m is None or m["total"] != "?":
        return None
    return Bar(line[: j + 1], int(m["n"]), None, m["rest"])


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


# torch's ExceptionWrapper: a DataLoader worker's exception re-raised in the main process carries
# the worker's own traceback in its message, after its first line.
_ORIGINAL = "\nOriginal Traceback (most recent call last):\n"
_EXC_HEAD = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,255}+)(?::\s?(?P<msg>.*))?$")


def worker_original(message: str) -> tuple[str, str, str] | None:
    """A DataLoader worker's wrapped exception (`Caught KeyError in DataLoader worker process 0.`
    then `Original Traceback ...` and its frames) as (the wrapper's first line, the worker's
    exception type, its message); None when `message` wraps nothing."""
    at = message.find(_ORIGINAL)
    if at < 0:
        return None
    lines = message[at + len(_ORIGINAL) :].splitlines()
    i = 0
    while i < len(lines) and lines[i][:1] in (" ", "\t"):
        i += 1  # the worker's frames
    m = _EXC_HEAD.match(lines[i]) if i < len(lines) else None
    if m is None:
        return None
    rest = [m.group("msg") or "", *lines[i + 1 :]]
    return message[:at].strip(), m.group("type"), "\n".join(rest).strip()


class LogHints(msgspec.Struct, frozen=True, kw_only=True):
    """What the command or its script says about how its log counts (core/logs/frameworks): None is
    not known."""

    logging_steps: int | None = None  # HF Trainer: a dict every N optimizer steps
    accumulate: int | None = None  # Lightning: batches per optimizer step
    evidence: str = ""  # where they were read, in words


class LogStep(msgspec.Struct, frozen=True):
    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    # The trainer's own pace at this step where its line says it (core/logs/logtiming): steps a
    # second, and what it was read from ("iteration times", "bar rate", "timestamps").
    rate: float | None = None
    rate_from: RateSource | None = None


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
    """`a=1.5, b=2` or `a: 1.5 b: 2` as numbers (what is not a number is left out; `lr=3e-4`
    keeps its exponent)."""
    out: dict[str, float] = {}
    toks = [m.group() for m in _TOKEN.finditer(text)]
    i, n = 0, len(toks)
    while i < n:
        tok = toks[i]
        first = _KEY_START.search(tok) if len(tok) <= _KEY_CHARS and not tok.isspace() else None
        j = i + 1
        if first is None:
            i = j
            continue
        key = tok[first.start() :]
        if j < n and toks[j].isspace():
            j += 1
        if (j < n and toks[j] == "=") or (j + 1 < n and toks[j] == ":" and toks[j + 1].isspace()):
            j += 1
        else:
            i += 1
            continue
        if j < n and toks[j].isspace():
            j += 1
        value = "".join(toks[j : j + 4 if j < n and toks[j] in ("+", "-") else j + 3])
        m = _VALUE.match(value)
        v = number(m.group()) if m is not None else None
        if v is not None:
            out[key] = v
        i = j + 1
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

    def rate_scale(self) -> float:
        """Steps per unit of the rate its bar draws (Lightning's bar counts batches)."""
        return 1.0
