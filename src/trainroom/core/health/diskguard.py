"""The disk guard: how full the checkpoint filesystem is, when the checkpoints will fill it, whether
the next one fits, and whether the root sits on a filesystem that truncates `torch.save`.

The observations (statvfs, /proc/mounts) are taken by `disk_usage` and `read_mounts`, both
injectable so tests can feed real figures from a real directory; the rules (`disk_high`,
`disk_full_soon`, `drvfs_checkpoints`) are pure functions of those observations and `now`.
Scenario 11: a checkpoint every step, 43 x 3.9 GB, filled the disk to 94 % overnight.
"""

from __future__ import annotations

import itertools
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding, Severity
from trainroom.core.probes import listing
from trainroom.core.samples import DiskSample
from trainroom.core.units import fmt_bytes, fmt_duration

DEFAULTS = Thresholds()
# What a save must leave free: a disk filled to the last byte breaks more than the checkpoint.
# 256 MiB, or 2 % of a small filesystem.
DEFAULT_RESERVE_BYTES = 256 << 20
RESERVE_FRACTION = 0.02
# Filesystems where torch.save has truncated checkpoints (WSL's DrvFs is 9p underneath) or where
# rename/fsync give weaker guarantees than a native disk.
REMOTE_FSTYPES = frozenset({"9p", "v9fs", "drvfs", "cifs", "smb3", "smbfs", "nfs", "nfs4", "fuse.sshfs"})


class Statvfs(Protocol):
    """What `os.statvfs` returns, as far as the guard reads it (a test hands in its own)."""

    @property
    def f_frsize(self) -> int: ...
    @property
    def f_bsize(self) -> int: ...
    @property
    def f_blocks(self) -> int: ...
    @property
    def f_bfree(self) -> int: ...
    @property
    def f_bavail(self) -> int: ...


StatvfsFn = Callable[[str], Statvfs]


class CheckpointWontFit(OSError):
    """The pre-save check: the next checkpoint would not fit (or leave no reserve)."""


class DiskUsage(msgspec.Struct, kw_only=True, frozen=True):
    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int  # what an unprivileged writer can still use (f_bavail), as df shows it
    budget: bool = False  # a byte budget for the root (`--disk-budget`), not a filesystem

    @property
    def what(self) -> str:
        return "checkpoint budget" if self.budget else "checkpoint disk"

    @property
    def used_fraction(self) -> float:
        # df's Use%: used / (used + available), so root's reserved blocks count as unusable.
        denom = self.used_bytes + self.free_bytes
        return self.used_bytes / denom if denom > 0 else 0.0

    def sample(self, mount: MountEntry | None = None) -> DiskSample:
        """This reading as `ProbeSample.disk`, with the filesystem of the root when known."""
        return DiskSample(
            path=self.path,
            total_bytes=self.total_bytes,
            used_bytes=self.used_bytes,
            free_bytes=self.free_bytes,
            used_fraction=round(self.used_fraction, 4),
            budget=self.budget,
            fstype=mount.fstype if mount is not None else None,
            mountpoint=mount.mountpoint if mount is not None else None,
            remote=mount.remote if mount is not None else None,
        )


class MountEntry(msgspec.Struct, kw_only=True, frozen=True):
    device: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...] = ()

    @property
    def remote(self) -> bool:
        # WSL mounts Windows drives as 9p with aname=drvfs; older WSL calls the type drvfs.
        return self.fstype in REMOTE_FSTYPES or any(o.startswith("aname=drvfs") for o in self.options)


class Projection(msgspec.Struct, kw_only=True, frozen=True):
    """When the checkpoints, at their size and cadence, make a save fail."""

    checkpoint_bytes: int
    cadence_s: float
    bytes_per_s: float
    saves_left: int  # how many more checkpoints fit (keeping the reserve)
    time_to_full_s: float  # from now until the save that will not fit


# --------------------------------------------------------------------------- observations


def disk_usage(path: str | os.PathLike[str], statvfs: StatvfsFn = os.statvfs) -> DiskUsage:
    """statvfs of the filesystem holding `path` (its nearest existing ancestor)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    st = statvfs(str(p))
    frsize = st.f_frsize or st.f_bsize
    total = st.f_blocks * frsize
    return DiskUsage(
        path=str(path),
        total_bytes=total,
        used_bytes=(st.f_blocks - st.f_bfree) * frsize,
        free_bytes=st.f_bavail * frsize,
    )


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes (\040 ...).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def budget_usage(root: str | os.PathLike[str], budget_bytes: int, used_bytes: int | None = None) -> DiskUsage:
    """The checkpoint root against a byte budget (`launch --disk-budget 50G`), as if the budget
    were a disk of its own: the same DISK_HIGH / DISK_FULL_SOON rules apply to it. `used_bytes`
    defaults to what the root holds (by lstat, symlinks not followed)."""
    if used_bytes is None:
        # Listings cached while unchanged; a large directory of other data re-measured slowly.
        used_bytes = listing.tree_bytes(root)
    return DiskUsage(
        path=str(root),
        total_bytes=budget_bytes,
        used_bytes=used_bytes,
        free_bytes=max(0, budget_bytes - used_bytes),
        budget=True,
    )


def read_mounts(mounts_path: str | os.PathLike[str] = "/proc/mounts") -> list[MountEntry]:
    entries: list[MountEntry] = []
    try:
        text = Path(mounts_path).read_text(errors="replace")
    except OSError:
        return entries
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        entries.append(
            MountEntry(
                device=_unescape(parts[0]),
                mountpoint=_unescape(parts[1]),
                fstype=parts[2],
                options=tuple(parts[3].split(",")),
            )
        )
    return entries


def mount_of(path: str | os.PathLike[str], mounts: Iterable[MountEntry]) -> MountEntry | None:
    """The mount holding `path` after resolving symlinks: the longest mountpoint prefix (the
    last one listed wins among equals, as the kernel stacks them)."""
    real = os.path.realpath(path)
    best: MountEntry | None = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        holds = real == mp or real.startswith(mp + "/") or mp == "/"
        if holds and (best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/")):
            best = m
    return best


def observe(
    root: str | os.PathLike[str],
    statvfs: StatvfsFn = os.statvfs,
    mounts_path: str | os.PathLike[str] = "/proc/mounts",
) -> DiskSample:
    """One disk reading for `ProbeSample.disk`: usage plus the filesystem type of the root."""
    return disk_usage(root, statvfs).sample(mount_of(root, read_mounts(mounts_path)))


# --------------------------------------------------------------------------- rules


def disk_high(usage: DiskUsage, th: Thresholds = DEFAULTS) -> Finding | None:
    """DISK_HIGH at th.disk_warn used, critical at th.disk_critical."""
    warn, critical = th.disk_warn, th.disk_critical
    frac = usage.used_fraction
    if frac < warn:
        return None
    severity: Severity = "critical" if frac >= critical else "warning"
    return Finding(
        code="DISK_HIGH",
        severity=severity,
        action="prune",
        key=usage.path,
        message=(
            f"{usage.what} {frac * 100:.1f}% used at {usage.path}: {fmt_bytes(usage.free_bytes)} free "
            f"of {fmt_bytes(usage.total_bytes)} (thresholds {warn * 100:.0f}% / {critical * 100:.0f}%)"
        ),
        evidence={
            "path": usage.path,
            "total_bytes": usage.total_bytes,
            "used_bytes": usage.used_bytes,
            "free_bytes": usage.free_bytes,
            "used_fraction": round(frac, 4),
            "budget": usage.budget,
            "warn": warn,
            "critical": critical,
        },
    )


def reserve_for(usage: DiskUsage, reserve_bytes: int | None = None) -> int:
    if reserve_bytes is not None:
        return reserve_bytes
    return min(DEFAULT_RESERVE_BYTES, int(usage.total_bytes * RESERVE_FRACTION))


def record_save(saves: list[tuple[float, int, int]], t: float, size: int, step: int, keep: int = 64) -> None:
    """Note a save `(t, size, step)` for the projection: files of the step just noted are that one
    checkpoint (a sharded save, each rank's file), their sizes added up. `t` is when the trainer
    wrote it (a verified copy the keeper makes later passes the original's mtime: a resumed run's
    keeper copying what is already there is no cadence of milliseconds)."""
    if saves and saves[-1][2] == step:
        saves[-1] = (saves[-1][0], saves[-1][1] + size, step)
    else:
        saves.append((t, size, step))
    del saves[:-keep]


def project(
    usage: DiskUsage, saves: Sequence[tuple[float, int]], now: float, reserve_bytes: int | None = None
) -> Projection | None:
    """Time to full from the recent saves, each `(t, size_bytes)` of a checkpoint that added a new
    file (an overwrite in place adds nothing and should not be passed; `record_save` makes one
    entry of a checkpoint's files). None with under 2 saves.
    The next save is due one cadence after the last (at once when that is past: a save that is
    late, or refused for want of space, moves the projection on rather than into the past)."""
    recent = sorted(saves)[-11:]
    if len(recent) < 2:
        return None
    intervals = [b[0] - a[0] for a, b in itertools.pairwise(recent) if b[0] > a[0]]
    if not intervals:
        return None
    cadence = statistics.median(intervals)
    # The largest of the last few: checkpoints grow (optimizer state appears after step 1).
    size = max(s for _, s in recent[-3:])
    if size <= 0 or cadence <= 0:
        return None
    saves_left = max(0, (usage.free_bytes - reserve_for(usage, reserve_bytes)) // size)
    next_t = max(recent[-1][0] + cadence, now)
    fail_t = next_t + saves_left * cadence
    return Projection(
        checkpoint_bytes=size,
        cadence_s=cadence,
        bytes_per_s=size / cadence,
        saves_left=int(saves_left),
        time_to_full_s=max(0.0, fail_t - now),
    )


def disk_full_soon(
    usage: DiskUsage,
    saves: Sequence[tuple[float, int]],
    now: float,
    *,
    th: Thresholds = DEFAULTS,
    reserve_bytes: int | None = None,
    prunable_bytes: int | None = None,
    writing: bool = True,
) -> Finding | None:
    """DISK_FULL_SOON while checkpoints are being written (`writing`: the trainer is alive) and
    the projection falls within th.disk_full_soon_s (critical within th.disk_full_critical_s);
    with no writer only when the next checkpoint of the same size would not fit at all (a rate
    means nothing once nobody writes)."""
    proj = project(usage, saves, now, reserve_bytes)
    if proj is None or proj.time_to_full_s > th.disk_full_soon_s or (not writing and proj.saves_left > 0):
        return None
    full_now = proj.saves_left == 0 or proj.time_to_full_s <= th.disk_full_critical_s
    severity: Severity = "critical" if full_now else "warning"
    when = (
        "the next checkpoint will not fit"
        if proj.saves_left == 0
        else f"{proj.saves_left} more fit; full in {fmt_duration(proj.time_to_full_s)}"
    )
    msg = (
        f"checkpoints of {fmt_bytes(proj.checkpoint_bytes)} every {fmt_duration(proj.cadence_s)} "
        f"({fmt_bytes(proj.bytes_per_s * 3600)}/h) with {fmt_bytes(usage.free_bytes)} free"
        f"{' in the budget' if usage.budget else ''}: {when}"
    )
    if prunable_bytes:
        msg += f"; prune would free {fmt_bytes(prunable_bytes)}"
    evidence: dict[str, Any] = {
        **msgspec.structs.asdict(proj),
        "free_bytes": usage.free_bytes,
        "path": usage.path,
        "budget": usage.budget,
        "writing": writing,
    }
    if prunable_bytes is not None:
        evidence["prunable_bytes"] = prunable_bytes
    return Finding(
        code="DISK_FULL_SOON",
        severity=severity,
        action="prune",
        key=usage.path,
        message=msg,
        evidence=evidence,
    )


def drvfs_checkpoints(root: str, mount: MountEntry | None) -> Finding | None:
    if mount is None or not mount.remote:
        return None
    kind = (
        "drvfs"
        if (mount.fstype == "drvfs" or any(o.startswith("aname=drvfs") for o in mount.options))
        else mount.fstype
    )
    return Finding(
        code="DRVFS_CHECKPOINTS",
        severity="warning",
        key=root,
        message=(
            f"checkpoint root {root} is on {mount.fstype} ({kind}, mounted at {mount.mountpoint}): "
            "torch.save there has written truncated checkpoints; save to a native Linux directory "
            "(e.g. ~/ckpt) and copy verified checkpoints out"
        ),
        evidence={
            "root": root,
            "fstype": mount.fstype,
            "mountpoint": mount.mountpoint,
            "device": mount.device,
            "options": list(mount.options),
        },
    )


def disk_findings(
    usage: DiskUsage,
    mount: MountEntry | None,
    saves: Sequence[tuple[float, int]],
    now: float,
    *,
    th: Thresholds = DEFAULTS,
    prunable_bytes: int | None = None,
    writing: bool = True,
    skipped: Skipped | None = None,
) -> list[Finding]:
    """Every disk rule over one reading: what the keeper calls each probe cycle."""
    soon = disk_full_soon(usage, saves, now, th=th, prunable_bytes=prunable_bytes, writing=writing)
    if soon is not None and skipped is not None and skipped.steps:
        soon = skipped.said(soon)
    out = [disk_high(usage, th), soon, drvfs_checkpoints(usage.path, mount)]
    return [f for f in out if f is not None]


# The note `save_checkpoint` sends for a save it refused before writing (it would not fit).
SKIPPED_NOTE = "checkpoint-skipped"


class Skipped(msgspec.Struct, kw_only=True, frozen=True):
    """The saves a trainer skipped since its last one (it said so in a `checkpoint-skipped`
    note), and the step of the last verified checkpoint: what a death now would cost."""

    steps: tuple[int, ...] = ()
    last_verified_step: int | None = None

    def said(self, f: Finding) -> Finding:
        """DISK_FULL_SOON once saves are being skipped: how many, which, and the steps at risk
        (every step since the last verified checkpoint), in place of "the next will not fit"."""
        n, first, last = len(self.steps), min(self.steps), max(self.steps)
        which = f"step {first}" if n == 1 else f"steps {first}–{last}"
        since = self.last_verified_step
        risk = last - since if since is not None else last
        at_risk = (
            f"{risk} steps at risk since the last verified checkpoint (step {since})"
            if since is not None
            else f"{risk} steps at risk: no checkpoint has verified yet"
        )
        head, _, tail = f.message.partition(": the next checkpoint will not fit")
        fit = "they do not fit" if n != 1 else "it does not fit"
        message = f"{head}: {n} save{'s' if n != 1 else ''} skipped ({which}), {fit}; {at_risk}{tail}"
        evidence = {**f.evidence, "skipped": n, "skipped_first": first, "skipped_last": last}
        evidence["steps_at_risk"], evidence["last_verified_step"] = risk, since
        return msgspec.structs.replace(f, message=message, evidence=evidence)


# --------------------------------------------------------------------------- the pre-save check


def next_save_fits(usage: DiskUsage, next_bytes: int, reserve_bytes: int | None = None) -> bool:
    return usage.free_bytes - next_bytes >= reserve_for(usage, reserve_bytes)


def check_fit(
    path: str | os.PathLike[str],
    next_bytes: int,
    *,
    statvfs: StatvfsFn = os.statvfs,
    reserve_bytes: int | None = None,
    budget_bytes: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> DiskUsage:
    """Raise CheckpointWontFit (ENOSPC) before writing a checkpoint that cannot fit: on the
    filesystem holding `path`, and within `budget_bytes` for the checkpoint `root` when given."""
    import errno

    usage = disk_usage(path, statvfs)
    checks = [usage]
    if budget_bytes:
        checks.append(budget_usage(root if root is not None else path, budget_bytes))
    for u in checks:
        reserve = reserve_for(u, reserve_bytes)
        if not next_save_fits(u, next_bytes, reserve):
            where = f"the {fmt_bytes(u.total_bytes)} budget of {u.path}" if u.budget else str(path)
            raise CheckpointWontFit(
                errno.ENOSPC,
                f"checkpoint of ~{fmt_bytes(next_bytes)} will not fit in {where}: {fmt_bytes(u.free_bytes)} free, "
                f"{fmt_bytes(reserve)} kept in reserve ({u.used_fraction * 100:.1f}% used); "
                "prune old checkpoints (`trainroom prune`) or free space",
            )
    return usage
