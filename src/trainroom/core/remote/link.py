"""A link to a remote keeper that drops is "unreachable since T", retried with backoff: what the
job view and the control room say of a node they cannot hear. Never "dead": whether the run
lives is the remote keeper's to say, and nobody has heard it.
"""

from __future__ import annotations

import random

import msgspec

from trainroom.core.units import fmt_clock, fmt_duration

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


class Backoff:
    """Doubling waits between reconnects (0.5 s, 1 s, 2 s, ... at most 30 s), each with ±20 %
    jitter so nodes that dropped together do not retry in step; `reset()` after a success."""

    def __init__(
        self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S, jitter: float = 0.2
    ) -> None:
        self.first_s, self.max_s, self.jitter = first_s, max_s, jitter
        self.tries = 0

    def next_wait(self) -> float:
        base = min(self.max_s, self.first_s * 2.0 ** min(self.tries, 30))
        self.tries += 1
        return float(base * (1 + random.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self.tries = 0


class Reachability(msgspec.Struct, kw_only=True):
    """Whether a node is heard: `since` is when it was last lost (None: reachable), `tries` the
    reconnects so far, `error` ssh's last words, `next_try_at` when the next one goes."""

    since: float | None = None
    error: str = ""
    tries: int = 0
    next_try_at: float | None = None

    @property
    def reachable(self) -> bool:
        return self.since is None

    def lost(self, t: float, error: str, next_try_at: float | None) -> None:
        if self.since is None:
            self.since = t
        self.error, self.next_try_at = error, next_try_at
        self.tries += 1

    def found(self) -> None:
        self.since, self.error, self.tries, self.next_try_at = None, "", 0, None

    def describe(self, now: float) -> str:
        if self.since is None:
            return "reachable"
        retry = (
            f"; retrying in {fmt_duration(max(0.0, self.next_try_at - now))}"
            if self.next_try_at is not None
            else ""
        )
        return f"unreachable since {fmt_clock(self.since)} ({fmt_duration(now - self.since)}){retry}: {self.error}"
