"""Findings about the keeper itself: what it cannot write. A keeper that cannot journal keeps
watching and serving clients from memory; this says so, with the errno, instead of going quiet."""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.journal.file import JournalHealth
from trainroom.core.run.parts import AttemptView
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


def rank_claimed(claims: list[tuple[int, int, int, int]], attempt: int | None) -> list[Finding]:
    """RANK_CLAIMED: a second reporter (a duplicate trainer, a stray script) said it was a rank a
    live reporter of this attempt already reports; it was refused. One finding per rank, naming
    both pids. `claims`: (attempt, rank, owner pid, claimant pid) of the claimants still alive."""
    latest: dict[int, tuple[int, int]] = {}
    for a, rank, owner, claimant in claims:
        if a == attempt:
            latest[rank] = (owner, claimant)
    return [
        Finding(
            code="RANK_CLAIMED",
            severity="warning",
            key=f"rank-{rank}",
            message=(
                f"pid {claimant} connected as rank {rank}, which pid {owner} already reports: refused "
                "(two trainers, or a script speaking for one?)"
            ),
            evidence={"rank": rank, "owner_pid": owner, "claimant_pid": claimant},
        )
        for rank, (owner, claimant) in sorted(latest.items())
    ]


def fields_refused(
    refusals: list[tuple[int, int, str, str, str, bool, int]], attempt: int | None
) -> list[Finding]:
    """FIELD_REFUSED: a trainer sent a value its field does not take (`lr=-1`, `vocab_size=0`,
    `tokens=-1`, a string for a number). That field was left out and the rest of the frame kept,
    so the run stays instrumented; a required field (a step's number) drops its frame. One finding
    per rank and field. `refusals`: (attempt, rank, field, value, reason, whole frame, count)."""
    out: list[Finding] = []
    for a, rank, field, value, reason, whole, count in refusals:
        if a != attempt:
            continue
        kept = "its frame was dropped" if whole else "the rest of the frame was kept"
        times = f" in {count} frames" if count > 1 else ""
        out.append(
            Finding(
                code="FIELD_REFUSED",
                severity="warning",
                key=f"rank-{rank}-{field}",
                message=(
                    f"rank {rank} sent {field}={value or '?'}{times}: refused ({reason}); {kept}. "
                    "Check what the trainer passes to trainroom.connect()/step()"
                ),
                evidence={
                    "rank": rank,
                    "field": field,
                    "value": value,
                    "reason": reason,
                    "count": count,
                    "frame_dropped": whole,
                },
            )
        )
    return out


def resume_from_scratch(a: AttemptView) -> Finding | None:
    """RESUME_FROM_SCRATCH: a resumed attempt whose first step is far below the checkpoint it
    was resumed from: the trainer ignored the checkpoint and started over (and will overwrite
    it). "Far below": under half the checkpoint's step, and more than 10 steps below it."""
    if a.resume_step is None or a.first_step is None or a.resume_step <= 0:
        return None
    if not (a.first_step < a.resume_step / 2 and a.resume_step - a.first_step > 10):
        return None
    return Finding(
        code="RESUME_FROM_SCRATCH",
        severity="critical",
        action="kill",
        key=f"attempt-{a.n}",
        message=(
            f"attempt {a.n} was resumed from step {a.resume_step} ({a.resume_from}) but its first step is "
            f"{a.first_step}: the trainer started over and will overwrite the checkpoint; stop it and "
            "resume with a template that loads it (--resume-template)"
        ),
        evidence={
            "attempt": a.n,
            "resume_step": a.resume_step,
            "first_step": a.first_step,
            "resume_from": a.resume_from,
        },
    )
