"""When a keeper may rest: its run has ended and nothing is in flight.

A resting keeper keeps its periodic work slow, not off: one probe every `rest_probe_s` (5 s by
default, trainroom.toml `[keeper] rest_probe_s`) and one tick after it, instead of a probe each
second and a tick every 0.1 s. Each probe still stats the watched checkpoints (a checkpoint written
after the end is seen and verified) and still runs the leftover scan (a process of the run left
behind is seen), and a record, a connection or a message wakes the keeper at once. Anything in
flight wakes it to the full cadence: a trainer, the handling of an attempt's end (an automatic
resume may follow), a confirmed action, a checkpoint queued, being verified or still settling, a
process of the run left behind, a finding about the machine. It exits after its linger unless a
viewer is attached. Pure: the keeper gathers the facts on its loop thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import msgspec

from trainroom.core.configuration.settings import RunSettings
from trainroom.core.keeper.lingering import DeadLingerers
from trainroom.core.vocab import CATALOGUE, FindingCode
from trainroom.core.wire import protocol as p

# Findings about the machine (GPU memory still held, a stale lock, a full disk) can clear by
# themselves after the run ended: while one is open the probes keep their full cadence.
MACHINE_FAMILIES = frozenset({"gpu", "host", "disk"})
# ...but not one that never changes by itself: checkpoints on a Windows drive stay there.
NEVER_CLEARS: frozenset[FindingCode] = frozenset({"DRVFS_CHECKPOINTS"})


REST_NOTE = (
    "the run has ended and nothing is in flight: the keeper rests (a probe every {rest:.0f} s) and exits"
    " once {linger:.0f} s pass with no viewer attached"
)
AWAKE_NOTE = "the keeper stops resting and probes each second again: "


class Quiet(msgspec.Struct, kw_only=True, frozen=True):
    """What could still change the run, as the keeper knows it at one moment."""

    trainer: bool  # an attempt's process runs
    ending: bool  # an attempt's end is still being handled (an automatic resume may follow)
    acting: bool  # a confirmed action is being carried out
    verifying: bool  # a checkpoint is queued, being verified, or a watched one still settling

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing is owed: the linger may count."""
        return not (self.trainer or self.ending or self.acting or self.verifying)


def machine_open(codes: Iterable[FindingCode]) -> bool:
    """Whether one of these open findings is about the machine (MACHINE_FAMILIES)."""
    return any(
        CATALOGUE[c].family in MACHINE_FAMILIES for c in codes if c in CATALOGUE and c not in NEVER_CLEARS
    )


def at_rest(
    q: Quiet,
    ended_at: float | None,
    probe: p.ProbeSample | None,
    *,
    machine: bool = False,
    settled_at: float | None = None,
) -> bool:
    """Idle, no finding about the machine open (`machine`), and a probe taken after the end and
    after the last checkpoint verdict (`settled_at`: the latest checkpoint and the disk are read
    at full cadence first) found no process of the run left (a leftover or a duplicate can still
    release memory or take the run's files: those are watched at full cadence)."""
    if not q.idle or machine:
        return False
    if ended_at is None:
        return True  # no attempt ever started (could not start): nothing to watch
    since = max(ended_at, settled_at or 0.0)
    if probe is None or probe.t < since:
        return False
    procs = probe.procs
    return procs is None or not (procs.leftovers or procs.duplicates or procs.states)


def awake_why(q: Quiet, probe: p.ProbeSample | None, *, machine: bool) -> str:
    """What ended a rest, in words (journaled: why the keeper probes each second again)."""
    procs = probe.procs if probe is not None else None
    for busy, why in (
        (q.trainer, "a trainer runs"),
        (q.ending, "an attempt's end is being handled"),
        (q.acting, "an action is being carried out"),
        (q.verifying, "a checkpoint is settling or being verified"),
        (machine, "a finding about the machine is open"),
        (procs is not None and bool(procs.leftovers), "a process of the run is left behind"),
        (procs is not None and bool(procs.duplicates), "another trainer runs the same command"),
    ):
        if busy:
            return why
    return "something changed"


def why_awake(
    q: Quiet,
    ended_at: float | None,
    probe: p.ProbeSample | None,
    open_codes: Iterable[FindingCode],
    settled_at: float | None,
) -> str | None:
    """None: the keeper may rest (`at_rest`); else why it may not, in words (`awake_why`)."""
    if not q.idle:
        return awake_why(q, probe, machine=False)  # each tick of a training run: read no more
    machine = machine_open(open_codes)
    if at_rest(q, ended_at, probe, machine=machine, settled_at=settled_at):
        return None
    return awake_why(q, probe, machine=machine)


def rest_wait(
    rest_s: float, linger_s: float, idle_since: float | None, now: float, *, viewers: bool, others: bool
) -> float:
    """How long a resting keeper sleeps before its next look (a record or a connection wakes it
    sooner): its rest cadence, or less when its linger ends sooner. While a viewer (a live
    subscription) is attached, or past the linger while another client (a `status`, an action's
    plan) is still answered, the linger does not end it: the rest cadence."""
    if viewers:
        return rest_s
    since = now if idle_since is None else idle_since
    left = since + linger_s - now
    if left <= 0 and others:
        return rest_s
    return min(rest_s, max(0.0, left) + 0.01)


def linger_over(linger_s: float, idle_since: float | None, now: float, *, others: bool) -> bool:
    """The keeper exits: idle for its linger with no viewer, and no other client being answered.
    Only a viewer restarts the linger: a `runs` or `status` that reads the run does not."""
    return idle_since is not None and now - idle_since > linger_s and not others


class _Served(Protocol):
    def has_clients(self) -> bool: ...


class Lingers(Protocol):
    """What the linger verdict reads of a keeper (keeper.loop.Keeper)."""

    idle_since: float | None
    _run_dir: Path
    _settings: RunSettings

    @property
    def server(self) -> _Served: ...

    @property
    def state(self) -> _Status: ...

    def _linger_s(self) -> float: ...


class _Status(Protocol):
    @property
    def status(self) -> str: ...


_DEAD: dict[Path, DeadLingerers] = {}  # one keeper per process: its run's marker


def linger_verdict(k: Lingers, now: float) -> str | None:
    """Why the keeper exits now (its linger is over, or too many dead runs' keepers linger and
    it is among the oldest), or None. A dead keeper that is idle is counted among the lingerers."""
    dead = _DEAD.setdefault(k._run_dir, DeadLingerers(k._run_dir, k._settings.max_dead_lingerers))
    if k.idle_since is None:
        dead.leave()
        return None
    if linger_over(k._linger_s(), k.idle_since, now, others=k.server.has_clients()):
        dead.leave()
        return f"keeper exits after {k._linger_s():.0f} s idle"
    if k.state.status != "dead":
        dead.leave()
        return None
    return dead.over_cap(k.idle_since, now)
