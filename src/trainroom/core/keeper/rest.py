"""When a keeper may rest: its run has ended and nothing can change until somebody asks.

A keeper whose trainer ended keeps no periodic work (no probe cycle, no tick) once these hold;
it wakes on what can change the run (a connection, a message, a record) and exits after its
linger unless a client is connected. Pure: the keeper gathers the facts on its loop thread.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from trainroom.core import protocol as p
from trainroom.core.vocab import CATALOGUE, FindingCode

# Findings about the machine (GPU memory still held, a stale lock, a full disk) can clear by
# themselves after the run ended: while one is open the probes go on, so it is seen to clear.
MACHINE_FAMILIES = frozenset({"gpu", "host", "disk"})


class Quiet(msgspec.Struct, kw_only=True, frozen=True):
    """What could still change the run, as the keeper knows it at one moment."""

    trainer: bool  # an attempt's process runs
    ending: bool  # an attempt's end is still being handled (an automatic resume may follow)
    acting: bool  # a confirmed action is being carried out
    verifying: bool  # a checkpoint is queued or being verified

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing is owed: the linger may count."""
        return not (self.trainer or self.ending or self.acting or self.verifying)


def machine_open(codes: Iterable[FindingCode]) -> bool:
    """Whether one of these open findings is about the machine (MACHINE_FAMILIES)."""
    return any(CATALOGUE[c].family in MACHINE_FAMILIES for c in codes if c in CATALOGUE)


def at_rest(q: Quiet, ended_at: float | None, probe: p.ProbeSample | None, *, machine: bool = False) -> bool:
    """Idle, no finding about the machine open (`machine`), and a probe taken after the end found
    no process of the run left (a leftover or a duplicate can still release memory or take the
    run's files: those are watched on)."""
    if not q.idle or machine:
        return False
    if ended_at is None:
        return True  # no attempt ever started (could not start): nothing to watch
    if probe is None or probe.t < ended_at:
        return False
    procs = probe.procs
    return procs is None or not (procs.leftovers or procs.duplicates or procs.states)


def rest_timeout(
    linger_s: float, idle_since: float | None, now: float, *, viewers: bool, others: bool
) -> float | None:
    """How long a resting keeper sleeps before it looks at its linger again: until the linger is
    over, or (None) until something wakes it: while a viewer (a live subscription) is attached,
    and past the linger while another client (a `status`, an action's plan) is still answered."""
    if viewers:
        return None
    since = now if idle_since is None else idle_since
    left = since + linger_s - now
    if left <= 0 and others:
        return None
    return max(0.0, left) + 0.01


def linger_over(linger_s: float, idle_since: float | None, now: float, *, others: bool) -> bool:
    """The keeper exits: idle for its linger with no viewer, and no other client being answered.
    Only a viewer restarts the linger: a `runs` or `status` that reads the run does not."""
    return idle_since is not None and now - idle_since > linger_s and not others
