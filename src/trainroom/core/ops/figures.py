"""The figure an evaluation printed, read in linear time on bounded lines.

An evaluation's output is the trainer's code's output: hostile data. It is read line by line; a
line longer than MAX_FIGURE_LINE characters (a progress bar gone wild, a dump) is skipped, so a
pattern's cost per line is bounded and the whole read is linear in the output's size, whatever it
holds (a 1 MiB line of digits or underscores included).

With no pattern of the user's, the default figure is the evaluation's own loss, by the name it is
printed under (`eval_loss=2.31`, `"eval_loss": 2.31`, `val loss 2.31`, `loss: 2.31`), in this
precedence: an evaluation's name (eval, val, valid, validation, test, dev) over a bare `loss` over a
training name (train, training); within one, the last printed wins. So a `train_loss` printed after
the `eval_loss` (as HF's trainer does) is not the figure. A user's pattern (`[eval] pattern`) is
taken as written: its group `loss` (else its first group, else the whole match), the last match
winning.
"""

from __future__ import annotations

import re

import msgspec

MAX_FIGURE_LINE = 4096  # characters: longer lines are not searched
# After the literal `loss`: an optional quote, `:` or `=` among a few blanks, then the number.
# Every quantifier is bounded: one attempt costs a constant, whatever follows.
_AFTER = re.compile(
    r"""["']?[ \t]{0,4}[:=]?[ \t]{0,4}"""
    r"(?P<loss>[-+]?(?:nan|inf(?:inity)?|\d{1,40}(?:\.\d{0,40})?(?:e[-+]?\d{1,3})?|\.\d{1,40}(?:e[-+]?\d{1,3})?))"
    r"(?![\d.])",
    re.IGNORECASE,
)
_LOSS = re.compile(r"loss", re.IGNORECASE)
# The word before `loss` (`eval_`, `val `), read from a window of at most 21 characters.
_NAME = re.compile(r"([A-Za-z]{1,20})[ _]$")
EVAL_NAMES = frozenset({"eval", "val", "valid", "validation", "test", "dev"})
TRAIN_NAMES = frozenset({"train", "training"})


class Figure(msgspec.Struct, frozen=True, kw_only=True):
    value: float
    name: str  # what it was printed as (`eval_loss`, `loss`) or `pattern` for a user's pattern
    text: str  # the matched text, at most 80 characters


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if len(ln) <= MAX_FIGURE_LINE]


def _rank(word: str) -> int:
    w = word.lower()
    return 0 if w in EVAL_NAMES else 2 if w in TRAIN_NAMES else 1


def default_figure(text: str) -> Figure | None:
    """The evaluation's own loss (see the module's precedence), or None."""
    best: tuple[int, Figure] | None = None
    for line in _lines(text):
        for m in _LOSS.finditer(line):
            i = m.start()
            if i > 0 and line[i - 1].isascii() and line[i - 1].isalnum():
                continue  # inside a longer word (`gloss`, `lossy` is refused by the number)
            num = _AFTER.match(line, m.end())
            if num is None:
                continue
            nm = _NAME.search(line[max(0, i - 21) : i])
            word = nm.group(1) if nm is not None else ""
            if nm is not None and nm.start(1) == 0 and i - 21 > 0 and line[i - 22].isalnum():
                word = ""  # the word runs on past the window: no name of a known kind
            name = f"{word}{line[i - 1]}{m.group(0)}" if word else m.group(0)
            try:
                value = float(num.group("loss"))
            except ValueError:
                continue
            fig = Figure(value=value, name=name, text=line[i : num.end()][:80])
            rank = _rank(word)
            if best is None or rank <= best[0]:
                best = (rank, fig)
    return best[1] if best is not None else None


def pattern_figure(text: str, pattern: str) -> Figure | None:
    """A user's pattern, searched line by line: the last match's figure, or None."""
    rx = re.compile(pattern)
    last: str | None = None
    where = ""
    for line in _lines(text):
        for m in rx.finditer(line):
            groups = m.groupdict()
            if "loss" in groups and groups["loss"] is not None:
                last = groups["loss"]
            elif m.groups():
                last = next((g for g in m.groups() if g is not None), None)
            else:
                last = m.group(0)
            where = m.group(0)[:80]
    if last is None:
        return None
    try:
        return Figure(value=float(last), name="pattern", text=where)
    except ValueError:
        return None


def find_figure(text: str, pattern: str | None = None) -> Figure | None:
    return pattern_figure(text, pattern) if pattern else default_figure(text)
