"""The fold of the keeper's own records: its start, its notes, the status it judges, its host/GPU
probe, the journal's damage it read past, and which log recogniser reads the trainer's log."""

from __future__ import annotations

from typing import Any, Protocol

from trainroom.core.configuration.config import Thresholds
from trainroom.core.run.parts import JournalDamage
from trainroom.core.vocab import StateName
from trainroom.core.wire import protocol as p

NOTES = 200


class Notes(Protocol):
    """What a note reads and writes of the run's state: its notes, the newest NOTES."""

    notes: list[dict[str, Any]]


class Run(Notes, Protocol):
    """What the keeper's handlers read and write of the run's state."""

    status: StateName
    status_reason: str
    status_since: float
    probe: p.ProbeSample | None
    closed_connections: int
    thresholds: Thresholds
    keeper_pid: int | None
    journal_damage: JournalDamage
    log_recogniser: str | None
    log_unit: str | None
    log_unread_lines: int | None
    resume_template: str | None
    resume_template_from: str | None


def _conn_closed(st: Run, r: p.ConnectionClosed) -> None:
    st.closed_connections += 1
    _note(st, {"t": r.t, "kind": "connection-closed", "message": r.reason})


def _probe(st: Run, r: p.ProbeSample) -> None:
    st.probe = r


def _status(st: Run, r: p.RunStatus) -> None:
    st.status, st.status_reason, st.status_since = r.state, r.reason, r.t


def _keeper_started(st: Run, r: p.KeeperStarted) -> None:
    st.thresholds, st.keeper_pid = r.thresholds, r.pid
    st.resume_template, st.resume_template_from = r.resume_template, r.resume_template_from


def _log_recognised(st: Run, r: p.LogRecognised) -> None:
    if r.name == "none":
        st.log_unread_lines = r.lines
        return
    st.log_recogniser, st.log_unit, st.log_unread_lines = r.name, r.unit or None, None


def _journal_damaged(st: Run, r: p.JournalDamaged) -> None:
    d = st.journal_damage
    if r.skipped_bytes:
        d.regions += 1
        d.skipped_bytes += r.skipped_bytes
        d.first_offset = r.offset if d.first_offset is None else d.first_offset
    d.unknown_records += r.unknown_records
    d.torn_tail = d.torn_tail or r.torn_tail


def _keeper_note(st: Run, r: p.KeeperNote) -> None:
    _note(st, {"t": r.t, "kind": r.kind, "message": r.message})


def _note(st: Notes, note: dict[str, Any]) -> None:
    st.notes.append(note)
    del st.notes[:-NOTES]
