"""A run's events for scripts (`trainroom events`): findings opened and cleared, state changes,
actions, attempts and alert deliveries, one flat Struct each, folded from the keeper's records.

The same records come from the journal (replay) and from a live keeper (deltas), so both read
the same. A finding is an event when it opens or its severity changes; the keeper's refreshes of
an open finding's figures are not events.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trainroom.core import units
from trainroom.core.run.ended import how_ended
from trainroom.core.units import signal_name
from trainroom.core.vocab import AlertKind, EventKind, FindingCode, NotifyOutcome, Severity, StateName
from trainroom.core.wire import protocol as p

# The records that can make an event (what `trainroom events --follow` must not count twice).
EVENT_RECORDS = (
    p.FindingRaised,
    p.FindingCleared,
    p.RunStatus,
    p.ActionRecord,
    p.AttemptStarted,
    p.AttemptEnded,
    p.NotifyResult,
    p.KeeperStarted,
)


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    t: float
    run: str
    event: EventKind
    # finding, finding-cleared
    ident: str | None = None
    code: FindingCode | None = None
    severity: Severity | None = None
    message: str | None = None
    evidence: dict[str, Any] = {}
    # state
    state: StateName | None = None
    reason: str | None = None
    # action (its name, outcome and client), attempt-*
    action: str | None = None
    ok: bool | None = None
    client: str | None = None
    attempt: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    exit_signal: str | None = None
    resume_from: str | None = None
    # alert (one delivery try; the channel is redacted)
    channel: str | None = None
    kind: AlertKind | None = None
    outcome: NotifyOutcome | None = None
    detail: str | None = None


class EventFold:
    """Records in, events out; remembers which findings are open (and at what severity)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._open: dict[str, tuple[Severity, FindingCode]] = {}  # ident -> (severity, code)

    def events(self, rec: p.Record) -> list[Event]:
        e = self._event(rec)
        return [] if e is None else [e]

    def _event(self, rec: p.Record) -> Event | None:
        run = self.run
        if isinstance(rec, p.FindingRaised):
            return self._raised(rec)
        if isinstance(rec, p.FindingCleared):
            was = self._open.pop(rec.ident, None)
            if was is None:
                return None
            return Event(
                t=rec.t, run=run, event="finding-cleared", ident=rec.ident, code=was[1], severity=was[0]
            )
        if isinstance(rec, p.RunStatus):
            return Event(t=rec.t, run=run, event="state", state=rec.state, reason=rec.reason or None)
        if isinstance(rec, p.ActionRecord):
            return Event(
                t=rec.t,
                run=run,
                event="action",
                action=rec.action,
                ok=rec.ok,
                message=rec.message,
                client=rec.client,
            )
        if isinstance(rec, p.AttemptStarted):
            return Event(
                t=rec.t,
                run=run,
                event="attempt-started",
                attempt=rec.n,
                pid=rec.pid,
                resume_from=rec.resume_from,
            )
        if isinstance(rec, p.AttemptEnded):
            return Event(
                t=rec.t,
                run=run,
                event="attempt-ended",
                attempt=rec.n,
                exit_code=rec.exit_code,
                exit_signal=signal_name(rec.exit_signal) if rec.exit_signal is not None else None,
                message=rec.error,
            )
        if isinstance(rec, p.NotifyResult):
            return Event(
                t=rec.t,
                run=run,
                event="alert",
                channel=rec.channel,
                kind=rec.kind,
                ident=rec.alert or None,
                severity=rec.severity,
                outcome=rec.outcome,
                detail=rec.detail or None,
            )
        if isinstance(rec, p.KeeperStarted):
            return Event(t=rec.t, run=run, event="keeper-started", pid=rec.pid)
        return None

    def _raised(self, rec: p.FindingRaised) -> Event | None:
        f = rec.finding
        was = self._open.get(f.ident)
        if was is not None and was[0] == f.severity:
            return None
        self._open[f.ident] = (f.severity, f.code)
        return Event(
            t=f.last_seen or f.first_seen,
            run=self.run,
            event="finding",
            ident=f.ident,
            code=f.code,
            severity=f.severity,
            message=f.message,
            action=f.action,
            evidence=f.evidence,
        )


def to_json(e: Event) -> str:
    """One JSON line (strict: a non-finite figure in the evidence is null)."""
    return units.to_json(e, indent=None)


def to_text(e: Event) -> str:
    """One line for a person: what happened, then its words."""
    what = {
        "finding": f"{e.severity} {e.code}: {e.message}",
        "finding-cleared": f"cleared {e.ident}",
        "state": f"{e.state}" + (f": {e.reason}" if e.reason else ""),
        "action": f"{e.action} {'ok' if e.ok else 'refused'}: {e.message}",
        "attempt-started": f"attempt {e.attempt} pid {e.pid}"
        + (f" from {e.resume_from}" if e.resume_from else ""),
        # `message`: why it could not start, or an adopted process's end: said as how it ended.
        "attempt-ended": f"attempt {e.attempt} {how_ended(e.exit_code, e.exit_signal, e.message)}",
        "alert": f"{e.kind} {e.ident or ''} via {e.channel}: {e.outcome}"
        + (f" ({e.detail})" if e.detail else ""),
        "keeper-started": f"keeper pid {e.pid}",
    }[e.event]
    return f"{e.event:15} {what}"
