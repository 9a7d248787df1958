"""Failpoints: named places where a test (or a user who wants to see what the keeper does when one
of its own parts breaks) makes the keeper raise on purpose. `TRAINROOM_FAILPOINTS` lists names,
comma-separated (`sanity.lr,probe.gpu,watchdog.locks`); `*` fails every guarded place except
the state rules. Unset, a failpoint costs one dict lookup.

The keeper's reliability tests use them to prove rule isolation on a real keeper process: a
part that raises becomes an INTERNAL_ERROR finding and every other part keeps working."""

from __future__ import annotations

import os

ENV = "TRAINROOM_FAILPOINTS"
# Never failed by `*`: without them there is no state to show at all (they can be named).
ESSENTIAL = frozenset({"watchdog.state"})

_parsed: tuple[str, frozenset[str]] = ("", frozenset())


class InjectedFault(RuntimeError):
    """Raised at a failpoint named in TRAINROOM_FAILPOINTS."""


def names() -> frozenset[str]:
    global _parsed
    raw = os.environ.get(ENV, "")
    if raw != _parsed[0]:
        _parsed = (raw, frozenset(n.strip() for n in raw.split(",") if n.strip()))
    return _parsed[1]


def check(name: str) -> None:
    """Raise InjectedFault when `name` is a failpoint that is switched on."""
    on = names()
    if on and (name in on or ("*" in on and name not in ESSENTIAL)):
        raise InjectedFault(f"failpoint {name} ({ENV})")
