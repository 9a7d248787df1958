"""Promotion: a verified candidate moves out of quarantine into its step directory, with its
manifest, and `latest` follows; a rejected one stays in quarantine with why.

A promotion builds the step directory under a dot name, writes the manifest, renames it into
place, then swaps `latest`: a kill at any moment leaves `latest` on a verified checkpoint (and
`Quarantine.sweep` finishes or undoes what it left). Used by the keeper for announced candidates,
by the SDK when it verifies inline, and for the verified copies of a watched file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from trainroom.core.ckpt import digest as digest
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.dirs import dir_digest
from trainroom.core.ckpt.report import Expected, VerifyReport, journal_report
from trainroom.core.wire import protocol as p


class CandidateChanged(layout.CheckpointError):
    """The candidate's bytes are not the ones verified: it is verified again, not promoted."""


def expected_for(
    root: str | os.PathLike[str],
    declared_arch: Mapping[str, object] | None = None,
    candidate: str | os.PathLike[str] | None = None,
) -> Expected:
    """What a new candidate is checked against: its save-time record, the declared config, and
    the latest verified checkpoint's fingerprint and stds."""
    side = layout.read_saved(candidate) if candidate is not None else None
    return Expected(
        digest=side.digest if side else None,
        size_bytes=side.size_bytes if side else None,
        step=side.step if side else None,
        arch=dict(declared_arch or {}),
        previous=layout.previous_verified(root),
    )


def _manifest_report(report: VerifyReport) -> layout.ManifestReport:
    return layout.ManifestReport(
        format=report.format,
        tensors=report.tensors,
        params=report.params,
        dtypes=report.dtypes,
        nonfinite=report.nonfinite,
        outliers=report.outliers,
        arch=report.arch,
        stds=report.stds,
        model_key=report.model_key,
        seconds=report.seconds,
        step=report.step,
        completeness=report.completeness,
    )


def _step_of(cand: Path, report: VerifyReport, side: layout.SaveRecord | None) -> int:
    if report.step is not None:
        return report.step
    if side is not None and side.step is not None:
        return side.step
    m = re.search(r"(\d+)", cand.name)
    return int(m.group(1)) if m else 0


def promote(
    candidate: str | os.PathLike[str],
    report: VerifyReport,
    root: str | os.PathLike[str] | None = None,
    *,
    file_name: str | None = None,
    step: int | None = None,
) -> Path:
    """Move a verified candidate to `<root>/step-NNNNNN/` with its manifest, then point `latest`
    at it. Refuses a report that did not pass or that names other bytes."""
    cand = Path(candidate)
    r = layout.checkpoint_root(root) if root is not None else cand.parent.parent
    if not report.ok:
        raise layout.CheckpointError(f"{cand.name} did not verify ({report.reason}): not promoting it")
    side = layout.read_saved(cand)
    st = cand.stat()
    size = layout.tree_bytes(cand) if cand.is_dir() else st.st_size
    if report.size_bytes not in (None, size):
        raise CandidateChanged(
            f"{cand.name} changed since it was verified ({size} bytes now): verify it again"
        )
    step = step if step is not None else _step_of(cand, report, side)
    target = layout.unique_path(r / layout.step_dir_name(step))
    stage = r / f".promote-{target.name}.{os.getpid()}"
    fname = file_name or cand.name
    stage.mkdir()
    staged = stage / fname
    try:
        os.rename(cand, staged)
        # What sits in the stage now is what gets promoted: the bytes, not the name, must be the
        # ones verified (a candidate replaced after its verdict, same size, is verified again).
        if report.digest is not None and digest_of(staged) != report.digest:
            raise CandidateChanged(
                f"{cand.name} changed since it was verified (digest differs): verify it again"
            )
        manifest = layout.Manifest(
            ok=True,
            file=fname,
            path=str(target / fname),
            step=step,
            size_bytes=size,
            digest=report.digest or (side.digest if side else None),
            digest_algo=report.digest_algo,
            saved_at=side.saved_at if side and side.saved_at is not None else st.st_mtime,
            verified_at=time.time(),
            source=side.source if side and side.source else str(cand),
            report=_manifest_report(report),
        )
        layout.write_json_atomic(stage / layout.MANIFEST, manifest)
        layout.fsync_dir(stage)
        os.rename(stage, target)
    except BaseException:
        _roll_back(stage, staged, cand)
        raise
    layout.fsync_dir(r)
    for suffix in (layout.SAVED_SUFFIX, layout.REASON_SUFFIX, layout.REPORT_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            Path(str(cand) + suffix).unlink()
    with contextlib.suppress(OSError):
        # The step directory is promoted; `latest` left behind (a full disk) is moved by the
        # next sweep, which points it at the newest verified checkpoint.
        layout.point_latest(r, target)
    return target


def _roll_back(stage: Path, staged: Path, cand: Path) -> None:
    """A promotion that could not finish (a full disk, a changed candidate): the checkpoint goes
    back to its quarantine name, the stage goes; `latest` was never moved. What cannot be undone
    here is left for `Quarantine.sweep`."""
    with contextlib.suppress(OSError):
        if os.path.lexists(staged) and not os.path.lexists(cand):
            os.rename(staged, cand)
    with contextlib.suppress(OSError):
        if not os.path.lexists(staged):
            shutil.rmtree(stage)


def digest_of(path: str | os.PathLike[str]) -> str:
    """A checkpoint's digest as the verifier takes it: a file's bytes, or a directory's files
    (`dirs.dir_digest`, symlinks not followed)."""
    p_ = Path(path)
    if not p_.is_dir():
        return digest.digest_file(p_)
    return dir_digest([(str(f.relative_to(p_)), digest.digest_file(f)) for f in targets.files_of(p_)])


def intact(step_dir: str | os.PathLike[str]) -> bool:
    """Whether a promoted checkpoint's bytes are still those its manifest says were verified
    (what prune and resume take for "verifies now" without loading it; a checkpoint without a
    recorded digest is taken as it is)."""
    d = Path(step_dir)
    manifest = layout.read_manifest(d)
    if manifest is None or not manifest.ok or not manifest.file:
        return False
    f = d / manifest.file
    if f.is_symlink() or not (f.is_file() or f.is_dir()):
        return False
    if manifest.digest is None:
        return True
    try:
        return digest_of(f) == manifest.digest
    except OSError:
        return False


def settle(
    candidate: str | os.PathLike[str],
    report: VerifyReport,
    root: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> p.CheckpointState:
    """Act on a verdict: promote a verified candidate, keep a rejected one in quarantine with its
    reason, leave a deferred one (verifier timed out, RAM short) as a candidate. Returns the
    record the keeper journals (path stays the candidate's; `report` says where it went)."""
    cand = Path(candidate)
    r = layout.checkpoint_root(root) if root is not None else cand.parent.parent
    t = time.time() if now is None else now
    state = p.CheckpointState(
        path=str(cand),
        step=report.step,
        state="rejected",
        t=t,
        reason=report.reason,
        size_bytes=report.size_bytes,
        digest=report.digest,
    )
    if report.ok:
        try:
            target = promote(cand, report, r)
        except CandidateChanged as exc:
            return msgspec.structs.replace(state, state="candidate", reason=str(exc))
        manifest = layout.read_manifest(target)
        return msgspec.structs.replace(
            state,
            step=manifest.step if manifest else report.step,
            state="verified",
            report=journal_report(
                report, promoted_dir=str(target), promoted_file=manifest.path if manifest else None
            ),
        )
    if report.deferred:
        return msgspec.structs.replace(state, state="candidate")
    if cand.exists():
        layout.Quarantine(r).reject(cand, report)
    return msgspec.structs.replace(state, report=journal_report(report))


def keep_verified_copy(
    src: str | os.PathLike[str],
    report: VerifyReport,
    root: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> Path | None:
    """For a trainer that overwrites one file (nanoGPT's out/ckpt.pt), or deletes its old
    checkpoints (HF's save_total_limit): copy the version that just verified into the root and
    promote it. The copy's own digest must equal the verified one, else the trainer changed it
    meanwhile and the copy is dropped (None). A directory checkpoint is copied file by file."""
    r = layout.checkpoint_root(root)
    q = layout.Quarantine(r)
    q.ensure()
    src = Path(src)
    tmp = q.dir / f".{src.name}.{os.getpid()}.tmp"
    s = step if step is not None else report.step
    try:
        got = _copy_dir(src, tmp) if src.is_dir() else _copy_file(src, tmp)
        if got != report.digest:
            _remove(tmp)
            return None
        for v in layout.verified_checkpoints(r):
            if v.digest == got and Path(v.file).name == src.name:
                _remove(tmp)
                return Path(v.dir)  # these bytes are kept already (a resume restored them)
        cand = layout.unique_path(
            q.dir / (f"{layout.step_dir_name(s)}-{src.name}" if s is not None else src.name)
        )
        os.rename(tmp, cand)
        layout.fsync_dir(q.dir)
    except BaseException:
        _remove(tmp)
        raise
    size = layout.tree_bytes(cand) if cand.is_dir() else cand.stat().st_size
    layout.write_json_atomic(
        Path(str(cand) + layout.SAVED_SUFFIX),
        layout.SaveRecord(
            step=s, size_bytes=size, digest=report.digest, saved_at=src.stat().st_mtime, source=str(src)
        ),
    )
    return promote(cand, msgspec.structs.replace(report, size_bytes=size), r, file_name=src.name, step=s)


def restore_copy(copy: str | os.PathLike[str], dest: str | os.PathLike[str], want: str | None) -> str:
    """Put a verified copy back where its trainer reads and writes it (a resume): `dest` is left
    alone when it holds those bytes already; otherwise what is there is moved aside to
    `<dest>.before-resume` and the copy written beside and renamed in, its digest checked.
    Returns what was done, one line; CheckpointError when the bytes are not the verified ones."""
    src, dst = Path(copy), Path(dest)
    if os.path.lexists(dst) and not dst.is_symlink() and want is not None and digest_of(dst) == want:
        return f"{dst} holds the verified bytes already"
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    _remove(tmp)
    try:
        got = _copy_dir(src, tmp) if src.is_dir() else _copy_file(src, tmp)
        if want is not None and got != want:
            raise layout.CheckpointError(f"{src} no longer holds the verified bytes: not restored")
        said = f"restored {dst} from the verified copy {src}"
        if os.path.lexists(dst):
            aside = dst.with_name(dst.name + targets.BEFORE_RESUME_SUFFIX)
            _remove(aside)
            os.rename(dst, aside)
            said += f" (what was there is kept as {aside.name})"
        os.rename(tmp, dst)
        layout.fsync_dir(dst.parent)
    except BaseException:
        _remove(tmp)
        raise
    return said


def set_aside(path: str | os.PathLike[str]) -> Path:
    """Move a rejected checkpoint the trainer keeps itself out of its way (HF's
    `resume_from_checkpoint=True` loads the newest `checkpoint-N/` there is): renamed beside
    itself to `<name>.rejected`, which no framework and no watch takes for a checkpoint."""
    src = Path(path)
    aside = layout.unique_path(src.with_name(src.name + targets.SET_ASIDE_SUFFIX))
    os.rename(src, aside)
    layout.fsync_dir(src.parent)
    return aside


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _copy_file(src: Path, dst: Path) -> str:
    """Copy, fsync, and return the digest of the bytes copied."""
    h = digest.new_hasher()
    with open(src, "rb") as fi, open(dst, "xb") as fo:
        while chunk := fi.read(digest.READ_CHUNK):
            h.update(chunk)
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    return digest.digest_hex(h)


def _copy_dir(src: Path, dst: Path) -> str:
    """A directory checkpoint copied file by file (symlinks are not followed); the digest of the
    copy the way the verifier takes it (`dirs.dir_digest`)."""
    dst.mkdir()
    entries: list[tuple[str, str | None]] = []
    for f in targets.files_of(src):
        rel = f.relative_to(src)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        entries.append((str(rel), _copy_file(f, dst / rel)))
    for d in sorted({x.parent for x in dst.rglob("*")} | {dst}):
        layout.fsync_dir(d)
    return dir_digest(entries)
