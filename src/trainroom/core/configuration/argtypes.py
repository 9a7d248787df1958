"""Argument types for the CLI: a number is finite and in its range, or argparse says which flag
and why in one line (exit 2), before anything starts."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
MAX_DURATION_S = 100 * 365 * 86400.0


def seconds(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected seconds in [{low:g}, {high:g}], got {text!r}")
        return value

    parse.__name__ = "seconds"
    return parse


def count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number in [{low}, {high}], got {text!r}")
        return value

    parse.__name__ = "count"
    return parse


def size(text: str) -> int:
    """500M, 20G, 1.5T (binary units), or plain bytes; positive and finite."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in SIZE_UNITS else (t, "")
    try:
        value = float(num) * SIZE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 500M or 20G, got {text!r}") from None
    if not math.isfinite(value) or value < 1 or value > 1 << 60:
        raise argparse.ArgumentTypeError(f"expected a positive size such as 500M or 20G, got {text!r}")
    return int(value)


def duration(text: str) -> float:
    """90s, 15m, 12h, 30d, 2w (or plain seconds), finite and at most a century: seconds."""
    t = text.strip().lower()
    num, unit = (t[:-1], t[-1]) if t and t[-1] in DURATION_UNITS else (t, "s")
    try:
        value = float(num) * DURATION_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 12h, 30d or 2w, got {text!r}"
        ) from None
    if not math.isfinite(value) or not 0 <= value <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"expected a duration between 0s and 100 years, got {text!r}")
    return value


def log_pattern(text: str) -> str:
    """A regular expression with named groups `step`, `loss`, `lr`, `grad_norm` (each optional:
    without `step` each matching line is a step); one that matches an empty line is refused."""
    why = log_pattern_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def log_pattern_problem(text: str) -> str | None:
    """Why `text` cannot be a log pattern, or None."""
    try:
        compiled = re.compile(text)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    if compiled.search("") is not None:
        return "the pattern matches an empty line, so every line would be a step"
    return None


def positive(high: float) -> Callable[[str], float]:
    """A finite number in (0, high]: a learning rate, a factor."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"expected a number in (0, {high:g}], got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def checked(value: object, low: float, high: float, *, whole: bool = False) -> float | int | None:
    """A number from an action request (JSON: anything may arrive), or None when it is not a
    finite number in [low, high] (a whole one when `whole`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if whole and not isinstance(value, int):
        return None
    if not math.isfinite(value) or not low <= value <= high:
        return None
    return value
