"""Rule isolation: one part that raises never silences the others.

Every rule, every sanity observer, every probe and the log reader runs through a `Guard`. A part
that raises returns its default (no findings, no change) and becomes an INTERNAL_ERROR finding
naming it and its exception; its traceback is handed to `on_fault` (the keeper journals it) the
first time and then at each power of ten, so a rule raising every tick costs a few records, not
one per tick. Every other part goes on: above all the life rules, so a SIGKILLed trainer is DEAD
whatever else is broken.

The finding stays open while the part keeps failing and `HOLD_S` after its last fault, so a
part that failed on one record is seen, and closes by itself once the part runs clean.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TypeVar

import msgspec

from trainroom.core import failpoints
from trainroom.core.findings import Finding
from trainroom.core.units import fmt_clock

T = TypeVar("T")

HOLD_S = 60.0
TRACEBACK_CHARS = 4000
# Parts without which the run's state itself is unknown: their faults are critical.
ESSENTIAL = frozenset({"watchdog.state", "watchdog.life"})


class Fault(msgspec.Struct, kw_only=True):
    """What one guarded part raised: the latest exception, when, and how often."""

    name: str
    error: str  # "ZeroDivisionError: float division by zero"
    traceback: str
    first_t: float
    last_t: float
    count: int = 1


FaultSink = Callable[[Fault], None]


def describe(exc: BaseException) -> tuple[str, str]:
    """(one line, the traceback's tail) of an exception."""
    line = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return line, text[-TRACEBACK_CHARS:]


class Guard:
    """Runs parts by name; turns what they raise into faults (see the module docstring)."""

    def __init__(self, on_fault: FaultSink | None = None, clock: Callable[[], float] = time.time) -> None:
        self.faults: dict[str, Fault] = {}
        self.on_fault = on_fault
        self.clock = clock

    def call(self, name: str, fn: Callable[[], T], default: T) -> T:
        try:
            failpoints.check(name)
            return fn()
        except Exception as exc:
            line, text = describe(exc)
            self.record(name, line, text)
            return default

    def record(self, name: str, error: str, text: str = "") -> None:
        """A fault of `name` (also for parts that ran elsewhere: a probe in its worker thread)."""
        now = self.clock()
        f = self.faults.get(name)
        if f is None or now - f.last_t > HOLD_S:
            f = self.faults[name] = Fault(name=name, error=error, traceback=text, first_t=now, last_t=now)
        else:
            f.count += 1
            f.last_t = now
            f.error, f.traceback = error, text or f.traceback
        if self.on_fault is not None and _worth_journaling(f.count):
            self.on_fault(f)

    def findings(self, now: float) -> list[Finding]:
        for name in [n for n, f in self.faults.items() if now - f.last_t > HOLD_S]:
            del self.faults[name]
        return [internal_error(f) for f in sorted(self.faults.values(), key=lambda f: f.name)]


def _worth_journaling(count: int) -> bool:
    """The first fault and then 10, 100, 1000...: a rule raising every tick stays a few records."""
    while count >= 10 and count % 10 == 0:
        count //= 10
    return count == 1


def internal_error(f: Fault) -> Finding:
    # The words stay while it keeps failing the same way (the count is evidence), so a rule that
    # raises every tick is not journaled again every tick.
    return Finding(
        code="INTERNAL_ERROR",
        severity="critical" if f.name in ESSENTIAL else "warning",
        key=f.name,
        message=(
            f"{f.name} raised {f.error} (first at {fmt_clock(f.first_t)}); it is skipped while it fails, every other rule keeps "
            "watching; the traceback is in the journal (trainroom events) — please report it"
        ),
        evidence={
            "part": f.name,
            "error": f.error,
            "count": f.count,
            "first_t": f.first_t,
            "last_t": f.last_t,
        },
    )
