"""Findings about the keeper itself: what it cannot write. A keeper that cannot journal keeps
watching and serving clients from memory; this says so, with the errno, instead of going quiet."""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.run.journal import JournalHealth
from trainroom.core.units import fmt_bytes, fmt_clock


def journal_write_failed(health: JournalHealth, where: str, backlog_bytes: int) -> Finding | None:
    """JOURNAL_WRITE_FAILED: the last journal write failed (ENOSPC on a full disk, EIO)."""
    if health.error is None:
        return None
    lost = f"; {health.dropped_records} record(s) dropped already" if health.dropped_records else ""
    return Finding(
        code="JOURNAL_WRITE_FAILED",
        severity="critical",
        message=(
            f"the keeper cannot write its journal in {where}: {health.error} (since "
            f"{fmt_clock(health.since)}); it keeps watching from memory, holding {health.pending_records} "
            f"record(s) ({fmt_bytes(health.pending_bytes)}) to write when space returns "
            f"(up to {fmt_bytes(backlog_bytes)}){lost}"
        ),
        evidence={
            "error": health.error,
            "errno": health.errno,
            "since": health.since,
            "pending_records": health.pending_records,
            "pending_bytes": health.pending_bytes,
            "dropped_records": health.dropped_records,
            "path": where,
        },
    )
