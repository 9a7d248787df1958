"""Prune: free disk by deleting old verified checkpoints, keeping what a resume may need.

Kept, always: the newest checkpoint whose bytes still match what was verified (checked by digest
when prune executes: `latest` replaced on disk does not let `--keep 1` delete the only good one),
the last N verified (default 2: a disk guard that keeps the last two is what people run by hand), pinned
ones, the one `latest` names, anything in `protect` (the checkpoint a resume is loading, a
candidate being verified), and everything in quarantine (candidates and rejected evidence) unless
rejected ones are asked for. Never touched: anything that is not a real directory named
`step-NNNNNN` with a verified manifest directly under the root, anything whose resolved path is
outside the root, and any symlink (a link is removed at most, never followed).

`plan` is a pure function of the listing; `execute` re-checks each target just before deleting.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import msgspec

from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.promote import intact
from trainroom.core.probes import listing
from trainroom.core.vocab import CkptState

DEFAULT_KEEP = 2
LAST_GOOD = "the newest that verifies now (those kept no longer match their verified digest)"
# A framework's own checkpoint in a root prune is pointed at (HF's checkpoint-N/, Lightning's
# step=N.ckpt): the trainer rotates those itself; deleting them behind its back is not ours to do.
_FOREIGN = (
    "a trainer's own checkpoint: prune deletes only verified checkpoints trainroom promoted "
    "(--keep-verified-copies); the trainer's rotation (save_total_limit, save_top_k) deletes these"
)


class PruneTarget(msgspec.Struct, kw_only=True):
    path: str
    step: int | None
    bytes: int
    kind: CkptState = "verified"  # verified | rejected


class Kept(msgspec.Struct, kw_only=True):
    path: str
    step: int | None
    why: str


class PrunePlan(msgspec.Struct, kw_only=True):
    root: str
    keep: int
    delete: list[PruneTarget] = []
    kept: list[Kept] = []
    skipped: list[Kept] = []  # entries prune will not touch, with why (a symlink, outside the root)
    bytes_to_free: int = 0


class PruneResult(msgspec.Struct, kw_only=True):
    root: str
    keep: int
    dry_run: bool
    deleted: list[PruneTarget] = []
    kept: list[Kept] = []
    skipped: list[Kept] = []
    failed: list[Kept] = []
    bytes_freed: int = 0


def _inside(root_real: str, path: str | os.PathLike[str]) -> bool:
    real = os.path.realpath(path)
    return real != root_real and real.startswith(root_real.rstrip("/") + "/")


def _resolved(protect: Iterable[str | os.PathLike[str]]) -> set[str]:
    """Protected paths, resolved: a file inside a step directory protects its directory."""
    out: set[str] = set()
    for x in protect:
        real = os.path.realpath(x)
        out.add(real)
        out.add(os.path.dirname(real))
    return out


def _unlisted(root: Path, listed: set[str]) -> list[Kept]:
    """What prune will not touch at the top of the root, with why: a symlink, a step-named
    directory without a verified manifest, a framework's own checkpoint."""
    out: list[Kept] = []
    try:
        entries = listing.select(root, "prune-unlisted", _maybe_unlisted)
    except FileNotFoundError:
        return out
    units = {u.name for u in targets.units_in(root)}
    for entry in entries:
        name = entry.name
        if name in listed or (
            not entry.is_symlink and not layout.STEP_DIR_RE.match(name) and name not in units
        ):
            continue
        e = root / name
        if entry.is_symlink:
            out.append(Kept(path=str(e), step=None, why=f"symlink to {os.readlink(e)}: never followed"))
        elif layout.STEP_DIR_RE.match(name):
            out.append(Kept(path=str(e), step=None, why="no verified manifest: not a promoted checkpoint"))
        elif name in units:
            hint = targets.step_hint(e)
            out.append(Kept(path=str(e), step=hint.step if hint else None, why=_FOREIGN))
    return out


def _maybe_unlisted(e: listing.Entry) -> bool:
    """Entries prune may have to say it keeps (told by the entry alone): not the pointer, the
    quarantine or a hidden file; a symlink, a directory, or a file a framework may have saved."""
    if e.name in (layout.LATEST, layout.QUARANTINE) or e.name.startswith("."):
        return False
    shaped = e.is_dir or e.name.endswith(targets.CHECKPOINT_SUFFIXES)
    return e.is_symlink or shaped or bool(layout.STEP_DIR_RE.match(e.name))


def _rejected(root: Path, root_real: str, protected: set[str]) -> list[PruneTarget]:
    """Rejected candidates in quarantine, each with its side files."""
    out: list[PruneTarget] = []
    for f in layout.Quarantine(root).rejected():
        if os.path.realpath(f) in protected or f.is_symlink() or not _inside(root_real, f):
            continue
        side = [Path(str(f) + s) for s in (layout.REASON_SUFFIX, layout.REPORT_SUFFIX, layout.SAVED_SUFFIX)]
        size = sum(x.lstat().st_size for x in [f, *side] if os.path.lexists(x))
        out.append(PruneTarget(path=str(f), step=None, bytes=size, kind="rejected"))
    return out


def _why_kept(
    v: layout.VerifiedCheckpoint, is_latest: bool, in_use: bool, newest: bool, keep: int
) -> str | None:
    if is_latest:
        return "latest"
    if in_use:
        return "in use (resume or verification)"
    if v.pinned:
        return "pinned"
    if newest:
        return f"one of the last {keep} verified"
    return None


def plan(
    root: str | os.PathLike[str],
    keep: int = DEFAULT_KEEP,
    *,
    protect: Iterable[str | os.PathLike[str]] = (),
    include_rejected: bool = False,
    check_digests: bool = True,
) -> PrunePlan:
    """What prune would delete and keep, and why, without deleting anything. With
    `check_digests` (reads the kept checkpoints' bytes; the keeper's once-a-second estimate of
    what prune could free goes without) the newest checkpoint that still matches its digest is
    kept whatever `keep` says."""
    if keep < 0:
        raise ValueError("keep must be >= 0")
    root_p = Path(root).absolute()
    root_real = os.path.realpath(root_p)
    out = PrunePlan(root=str(root_p), keep=keep)
    protected = _resolved(protect)
    latest = layout.latest_dir(root_p)
    latest_real = os.path.realpath(latest) if latest else None
    pointer = root_p / layout.LATEST
    if pointer.is_symlink() and latest is None:
        note = f"latest -> {os.readlink(pointer)} is not a verified step dir here: not followed"
        out.skipped.append(Kept(path=str(pointer), step=None, why=note))
    verified = layout.verified_checkpoints(root_p)
    out.skipped += _unlisted(root_p, {os.path.basename(v.dir) for v in verified})
    newest = {v.dir for v in verified[-keep:]} if keep else set()
    for v in reversed(verified):
        real = os.path.realpath(v.dir)
        if not _inside(root_real, v.dir):
            out.skipped.append(Kept(path=v.dir, step=v.step, why="resolves outside the root"))
            continue
        why = _why_kept(v, real == latest_real, real in protected, v.dir in newest, keep)
        if why:
            out.kept.append(Kept(path=v.dir, step=v.step, why=why))
        else:
            out.delete.append(PruneTarget(path=v.dir, step=v.step, bytes=v.size_bytes))
    last_good = _last_good(out) if check_digests else None
    if last_good is not None:
        out.delete = [t for t in out.delete if t.path != last_good.path]
        out.kept.append(Kept(path=last_good.path, step=last_good.step, why=LAST_GOOD))
    if include_rejected:
        out.delete += _rejected(root_p, root_real, protected)
    out.bytes_to_free = sum(t.bytes for t in out.delete)
    return out


def _last_good(pl: PrunePlan) -> PruneTarget | None:
    """When no verified checkpoint prune keeps still matches its digest, the newest one it
    would delete that does (None: a kept one is good, or none is). Re-checked at execution: the
    bytes may have changed since the plan."""
    kept = {k.path for k in pl.kept}
    for v in reversed(layout.verified_checkpoints(pl.root)):
        if v.dir in kept and intact(v.dir):
            return None
    for t in pl.delete:  # newest first
        if t.kind == "verified" and intact(t.path):
            return t
    return None


ARRIVED = "eligible since the plan was confirmed: not confirmed, so not deleted"


class ConfirmedPart(msgspec.Struct, kw_only=True):
    """A prune planned again at confirmation, cut to what was confirmed."""

    plan: PrunePlan  # deletes only confirmed checkpoints that are still eligible
    arrived: list[PruneTarget] = []  # eligible now, not confirmed: kept, and named
    no_longer: list[Kept] = []  # confirmed, no longer eligible (kept now, or gone): not deleted


def confirmed_part(now: PrunePlan, confirmed: dict[str, int | None]) -> ConfirmedPart:
    """`now` cut to the `confirmed` paths (path -> step): a run that saves while a person reads
    the plan makes more checkpoints eligible; deleting them would delete what nobody confirmed."""
    wanted = set(confirmed)
    eligible = {t.path for t in now.delete}
    keep = [t for t in now.delete if t.path in wanted]
    arrived = [t for t in now.delete if t.path not in wanted]
    kept_why = {k.path: k.why for k in now.kept}
    no_longer = [
        Kept(path=path, step=confirmed[path], why=kept_why.get(path, "no longer on disk"))
        for path in sorted(wanted - eligible)
    ]
    kept = [*now.kept, *(Kept(path=t.path, step=t.step, why=ARRIVED) for t in arrived)]
    cut = msgspec.structs.replace(now, delete=keep, kept=kept, bytes_to_free=sum(t.bytes for t in keep))
    return ConfirmedPart(plan=cut, arrived=arrived, no_longer=no_longer)


def execute(
    pl: PrunePlan, *, dry_run: bool = False, protect: Iterable[str | os.PathLike[str]] = ()
) -> PruneResult:
    """Delete what the plan lists, re-checking each target first (it may have changed)."""
    res = PruneResult(
        root=pl.root, keep=pl.keep, dry_run=dry_run, kept=list(pl.kept), skipped=list(pl.skipped)
    )
    root_real = os.path.realpath(pl.root)
    latest = layout.latest_dir(pl.root)
    latest_real = os.path.realpath(latest) if latest else None
    protected = _resolved(protect)
    last_good = _last_good(pl)
    for t in pl.delete:
        p_ = Path(t.path)
        if last_good is not None and t.path == last_good.path:
            res.kept.append(Kept(path=t.path, step=t.step, why=LAST_GOOD))
            continue
        refuse = None
        if p_.is_symlink():
            refuse = "became a symlink"
        elif not _inside(root_real, p_) or os.path.dirname(os.path.realpath(p_)) not in (
            root_real,
            os.path.join(root_real, layout.QUARANTINE),
        ):
            refuse = "outside the root"
        elif os.path.realpath(p_) == latest_real:
            refuse = "is latest now"
        elif os.path.realpath(p_) in protected:
            refuse = "in use"
        if refuse:
            res.failed.append(Kept(path=t.path, step=t.step, why=f"not deleted: {refuse}"))
            continue
        if dry_run:
            res.deleted.append(t)
            res.bytes_freed += t.bytes
            continue
        try:
            if t.kind == "rejected":
                for s in ("", layout.REASON_SUFFIX, layout.REPORT_SUFFIX, layout.SAVED_SUFFIX):
                    x = Path(t.path + s)
                    if os.path.lexists(x):
                        x.unlink()
            else:
                # rmtree never follows a symlink inside the tree (it unlinks the link itself).
                shutil.rmtree(p_)
        except OSError as exc:
            res.failed.append(Kept(path=t.path, step=t.step, why=f"not deleted: {exc.strerror or exc}"))
            continue
        res.deleted.append(t)
        res.bytes_freed += t.bytes
    if res.deleted and not dry_run:
        layout.fsync_dir(pl.root)
    return res


def prune(
    root: str | os.PathLike[str],
    keep: int = DEFAULT_KEEP,
    *,
    dry_run: bool = False,
    protect: Iterable[str | os.PathLike[str]] = (),
    include_rejected: bool = False,
) -> PruneResult:
    """Plan and execute: what the keeper's prune action calls (journal `bytes_freed` after)."""
    protect = list(protect)
    return execute(
        plan(root, keep, protect=protect, include_rejected=include_rejected), dry_run=dry_run, protect=protect
    )
