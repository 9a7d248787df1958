"""The state dir's disk, where every run's journal lives: STATE_DISK_LOW.

The checkpoint disk has its own guard (diskguard: DISK_HIGH, DISK_FULL_SOON). The state dir is
often elsewhere (the home directory, a small root filesystem), and a run that lasts weeks writes
its journal there all along: this says when that disk fills, with the journal's share and write
rate, before JOURNAL_WRITE_FAILED has to. When the state dir shares the checkpoint disk (and no
byte budget stands in for that disk), DISK_HIGH already says the disk is full; this then speaks
only of the journal's own projection.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from trainroom.core.findings import Finding, Severity
from trainroom.core.health.diskguard import DiskUsage, disk_usage
from trainroom.core.journal.writer import JournalUsage
from trainroom.core.units import fmt_bytes, fmt_duration

HORIZON_S = 12 * 3600.0  # warn when the journal alone fills the disk within this
CRITICAL_S = 3600.0


class OutputLoss(msgspec.Struct, kw_only=True, frozen=True):
    """What of the trainer's stdout/stderr could not be written to trainer.log (the keeper's
    output pump drops it rather than let the write error reach the trainer)."""

    lost_bytes: int = 0
    since: float | None = None  # the latest loss began
    losing: bool = False  # the latest write failed; writing resumes by itself with space
    resumed: float | None = None  # writing worked again after the latest loss
    path: str = ""


class StateDisk(msgspec.Struct, kw_only=True, frozen=True):
    usage: DiskUsage  # the state dir's filesystem
    journal: JournalUsage
    # DISK_HIGH already watches this filesystem (the checkpoint root is on it, without a budget).
    covered: bool = False
    output: OutputLoss = OutputLoss()


def observe(
    run_dir: Path,
    journal: JournalUsage,
    ckpt_root: str | None,
    ckpt_budget: bool,
    output: OutputLoss | None = None,
) -> StateDisk:
    """One reading (a statvfs and two stats): for the keeper's probe thread."""
    usage = disk_usage(run_dir)
    covered = False
    if ckpt_root is not None and not ckpt_budget:
        try:
            root = Path(ckpt_root)
            while not root.exists() and root != root.parent:
                root = root.parent
            covered = os.stat(root).st_dev == os.stat(run_dir).st_dev
        except OSError:
            covered = False
    return StateDisk(usage=usage, journal=journal, covered=covered, output=output or OutputLoss())


def state_disk_low(obs: StateDisk, warn: float, critical: float) -> Finding | None:
    """STATE_DISK_LOW: the state dir's disk over the thresholds (unless DISK_HIGH covers it), or
    filling within HORIZON_S at the journal's own write rate; critical while the trainer's output
    is being dropped for want of space."""
    u, j, out = obs.usage, obs.journal, obs.output
    frac = u.used_fraction
    full_in = u.free_bytes / j.bytes_per_h * 3600.0 if j.bytes_per_h else None
    severity: Severity | None = None
    if frac >= warn and not obs.covered:
        severity = "critical" if frac >= critical else "warning"
    if full_in is not None and full_in <= HORIZON_S:
        severity = "critical" if full_in <= CRITICAL_S or severity == "critical" else "warning"
    if out.losing:
        severity = "critical"
    if severity is None:
        return None
    rate = f", writing {fmt_bytes(j.bytes_per_h)}/h" if j.bytes_per_h else ""
    when = f" (full in {fmt_duration(full_in)} at that rate)" if full_in is not None else ""
    return Finding(
        code="STATE_DISK_LOW",
        severity=severity,
        key=u.path,
        message=(
            _output_words(out)
            + f"state dir disk {frac * 100:.1f}% used at {u.path}: {fmt_bytes(u.free_bytes)} free of "
            f"{fmt_bytes(u.total_bytes)}; this run's journal takes {fmt_bytes(j.bytes)}{rate}{when}; "
            "free space there, or let old runs go (`trainroom runs --prune-older-than 30d`)"
        ),
        evidence={
            **msgspec.structs.asdict(u),
            "used_fraction": u.used_fraction,
            "journal_bytes": j.bytes,
            "journal_bytes_per_h": j.bytes_per_h,
            "journal_segments": j.segments,
            "time_to_full_s": full_in,
            "warn": warn,
            "critical": critical,
            "covered_by_disk_high": obs.covered,
            "output_lost_bytes": out.lost_bytes,
            "output_losing": out.losing,
            "output_lost_since": out.since,
            "output_resumed": out.resumed,
        },
    )


def _output_words(out: OutputLoss) -> str:
    if not out.lost_bytes:
        return ""
    name = Path(out.path).name or "trainer.log"
    at = time.strftime("%H:%M:%S", time.localtime(out.since)) if out.since is not None else "?"
    if out.losing:
        return (
            f"the trainer's output is being lost: {out.lost_bytes} bytes not written to {name} since {at} "
            "(the trainer goes on; writing resumes by itself when space returns); "
        )
    return f"{out.lost_bytes} bytes of the trainer's output were lost (not written to {name}, from {at}); "
