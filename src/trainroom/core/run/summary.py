"""A run in one line: the small per-run summary `trainroom runs` and the control room's picker read.

The keeper writes `summary.msgpack` (atomically, a few hundred bytes) every few seconds while the
run changes, with each snapshot, and when it exits. It names the journal position it reflects
(the active segment's inode and size); a reader trusts it only while the journal is still that
size, which costs one stat and no journal read. A stale one (the keeper was killed after its last
summary) is passed over and the run is read from its snapshot and journal tail instead.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import msgspec

from trainroom.core.run.causes import fold
from trainroom.core.run.figures import run_loss
from trainroom.core.run.state import RunState
from trainroom.core.vocab import FindingCode, Severity, ShownState, StateName

SUMMARY_NAME = "summary.msgpack"
VERSION = 1


class WorstFinding(msgspec.Struct, kw_only=True, frozen=True):
    code: FindingCode
    severity: Severity
    message: str


class JournalMark(msgspec.Struct, kw_only=True, frozen=True):
    """The active journal segment as it was when the summary was written."""

    inode: int
    size: int


class RunSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    v: int = VERSION
    run_id: str
    created: float
    status: StateName
    status_reason: str = ""
    status_since: float = 0.0
    attempt: int | None = None
    attempt_ended: bool = True  # no attempt, or the last one has ended
    pid: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    step: int | None = None
    loss: float | None = None  # the median across ranks, as `status` shows it
    steps_total: int = 0
    last_step_t: float | None = None
    started_at: float | None = None  # the last attempt's start
    ended_at: float | None = None  # ... and end
    findings: int = 0  # open findings
    worst: WorstFinding | None = None  # the first root cause in the control room's order
    updated: float = 0.0
    journal: JournalMark | None = None
    job: str | None = None  # the job this run is a node of (launch --job, torchrun's rdzv id)
    attached: bool = False  # its last attempt is a process `trainroom attach` adopted

    def shown_state(self, keeper_alive: bool) -> ShownState:
        """The state `status` would show (`unknown`: the keeper died before its trainer)."""
        if not keeper_alive and not self.attempt_ended:
            return "unknown"
        return self.status


def summarize(st: RunState, *, updated: float = 0.0, journal: JournalMark | None = None) -> RunSummary:
    a = st.attempt
    loss = run_loss(st).median
    found = st.open_findings()
    rows = fold(found)  # the first row's root cause: never a consequence while its cause is open
    worst = rows[0].head if rows else None
    return RunSummary(
        run_id=st.run_id,
        created=st.created,
        status=st.status,
        status_reason=st.status_reason,
        status_since=st.status_since,
        attempt=a.n if a else None,
        attempt_ended=a is None or a.ended_at is not None,
        pid=a.pid if a else None,
        exit_code=a.exit_code if a else None,
        exit_signal=a.exit_signal if a else None,
        step=st.current_step(),
        loss=loss,
        steps_total=st.steps_total,
        last_step_t=st.last_step_t(),
        started_at=a.started_at if a else None,
        ended_at=a.ended_at if a else None,
        findings=len(found),
        worst=WorstFinding(code=worst.code, severity=rows[0].severity, message=worst.message)
        if worst
        else None,
        updated=updated,
        journal=journal,
        job=st.options.job.name if st.options.job is not None else None,
        attached=a.attached if a else False,
    )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunSummary)


def journal_mark(path: Path) -> JournalMark | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return JournalMark(inode=st.st_ino, size=st.st_size)


def write(run_dir: Path, summary: RunSummary) -> None:
    body = _encoder.encode(summary)
    tmp = run_dir / (SUMMARY_NAME + ".tmp")
    with open(tmp, "wb") as f:
        f.write(zlib.crc32(body).to_bytes(4, "big") + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / SUMMARY_NAME)


def read(run_dir: Path) -> RunSummary | None:
    """The summary when it is whole, else None (its freshness is `fresh`'s question)."""
    try:
        data = (run_dir / SUMMARY_NAME).read_bytes()
    except OSError:
        return None
    if len(data) < 4 or int.from_bytes(data[:4], "big") != zlib.crc32(data[4:]):
        return None
    try:
        s = _decoder.decode(data[4:])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return s if s.v == VERSION else None


def fresh(summary: RunSummary, journal_path: Path) -> bool:
    """Whether the summary reflects the journal as it is now (same segment, same size)."""
    return summary.journal is not None and journal_mark(journal_path) == summary.journal
