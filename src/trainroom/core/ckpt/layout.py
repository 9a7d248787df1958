"""The on-disk layout of a checkpoint root, shared by the SDK's save, the keeper and the CLI.

Layout under the checkpoint root (`TRAINROOM_CKPT_ROOT` unless given)::

    .quarantine/step-000300.pt             a candidate: fsynced, renamed into place, not trusted yet
    .quarantine/step-000300.pt.saved.json  size and digest taken while it was written
    .quarantine/step-000250.pt.reason      a rejected candidate stays, with why (and .verify.json)
    step-000200/step-000200.pt             promoted: verified, with manifest.json beside it
    latest -> step-000200                  a symlink (or a pointer file) replaced by rename

Writers here fsync the file and then its directory, and replace by rename: a kill at any moment
leaves `latest` on a verified checkpoint. Promotion is `ckpt.promote`; the trainer's save is
`sdk.save`. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import TypeVar

import msgspec

from trainroom.core.ckpt.digest import DIGEST_ALGO
from trainroom.core.ckpt.report import Arch, NonFinite, Outlier, Previous, VerifyReport
from trainroom.core.probes import listing
from trainroom.core.probes.procs import pid_alive
from trainroom.core.resumable import Completeness

ENV_ROOT = "TRAINROOM_CKPT_ROOT"
QUARANTINE = ".quarantine"
LATEST = "latest"
MANIFEST = "manifest.json"
PIN = ".pinned"
SAVED_SUFFIX = ".saved.json"
REASON_SUFFIX = ".reason"
REPORT_SUFFIX = ".verify.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)(?:-(\d+))?$")
_SIDE_SUFFIXES = (SAVED_SUFFIX, REASON_SUFFIX, REPORT_SUFFIX, ".tmp")


class CheckpointError(Exception):
    """A checkpoint operation that cannot go on; str() is one line."""


class SaveRecord(msgspec.Struct, kw_only=True, frozen=True):
    """`<candidate>.saved.json`: what was known of the file as it was written."""

    step: int | None = None
    size_bytes: int | None = None
    digest: str | None = None
    digest_algo: str = DIGEST_ALGO
    saved_at: float | None = None
    pid: int | None = None  # the writer (a save by the SDK)
    source: str | None = None  # the file it was copied from (a watched file's verified copy)


class ManifestReport(msgspec.Struct, kw_only=True, frozen=True):
    """What a manifest keeps of the verification: what the next checkpoint is compared with."""

    format: str | None = None
    tensors: int = 0
    params: int = 0
    dtypes: dict[str, int] = {}
    nonfinite: dict[str, NonFinite] = {}
    outliers: list[Outlier] = []
    arch: Arch = msgspec.field(default_factory=Arch)
    stds: dict[str, float] = {}
    model_key: str | None = None
    seconds: float = 0.0
    step: int | None = None
    completeness: Completeness | None = None  # what it holds of a faithful resume


class Manifest(msgspec.Struct, kw_only=True, frozen=True):
    """`<step dir>/manifest.json`: a promoted checkpoint, verified. Only a manifest with `ok`
    makes a step directory a checkpoint that `latest`, resume and prune will consider."""

    version: int = 1
    ok: bool = False
    file: str = ""  # the checkpoint file's name inside the step directory
    path: str = ""
    step: int | None = None
    size_bytes: int | None = None
    digest: str | None = None
    digest_algo: str = DIGEST_ALGO
    saved_at: float = 0.0
    verified_at: float = 0.0
    source: str = ""  # where it was written (the candidate, or a watched file)
    pinned: bool = False
    report: ManifestReport = msgspec.field(default_factory=ManifestReport)


class VerifiedCheckpoint(msgspec.Struct, kw_only=True, frozen=True):
    dir: str
    file: str
    step: int
    size_bytes: int
    saved_at: float
    digest: str | None = None
    pinned: bool = False


# --------------------------------------------------------------------------- small file tools


def checkpoint_root(root: str | os.PathLike[str] | None = None) -> Path:
    value = root if root is not None else os.environ.get(ENV_ROOT)
    if not value:
        raise CheckpointError(f"no checkpoint root: pass root= or set {ENV_ROOT}")
    return Path(value).expanduser().absolute()


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def candidate_name(step: int) -> str:
    return f"{step_dir_name(step)}.pt"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, record: msgspec.Struct) -> None:
    """The record as indented JSON, fsynced, replacing `path` by rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.json.format(msgspec.json.encode(record), indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_R = TypeVar("_R", bound=msgspec.Struct)


def read_record(path: Path, kind: type[_R]) -> _R | None:
    """A JSON record written here; None when it is missing, unreadable or not one."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError):
        return None


def read_manifest(step_dir: Path) -> Manifest | None:
    return read_record(step_dir / MANIFEST, Manifest)


def read_saved(candidate: str | os.PathLike[str]) -> SaveRecord | None:
    return read_record(Path(str(candidate) + SAVED_SUFFIX), SaveRecord)


def unique_path(path: Path) -> Path:
    if not os.path.lexists(path):
        return path
    stem, suffix = (path.name[: -len(path.suffix)], path.suffix) if path.suffix else (path.name, "")
    for i in range(2, 10_000):
        cand = path.with_name(f"{stem}-{i}{suffix}")
        if not os.path.lexists(cand):
            return cand
    raise CheckpointError(f"no free name next to {path}")


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes under `path` by lstat, never following a symlink."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


# --------------------------------------------------------------------------- quarantine


class Quarantine:
    """The candidates of one checkpoint root: written, not yet trusted."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.dir = self.root / QUARANTINE

    def unsafe(self) -> str | None:
        """Why this quarantine must not be used (written, swept, deleted in), or None: it must be
        a real directory right under the root, never a symlink out of it."""
        if self.dir.is_symlink():
            return f"{self.dir} is a symbolic link (to {os.readlink(self.dir)}): nothing follows it out of the root"
        if os.path.lexists(self.dir) and not self.dir.is_dir():
            return f"{self.dir} is not a directory"
        return None

    def ensure(self) -> Path:
        """The quarantine directory, created if missing; CheckpointError when it is unsafe."""
        why = self.unsafe()
        if why is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            why = self.unsafe()  # created meanwhile as a link by someone else
        if why is not None:
            raise CheckpointError(f"refusing the quarantine: {why}")
        return self.dir

    def _settle_stage(self, stage: Path, name: str, may_undo: bool) -> str:
        """A promotion a dead process left: finished when its manifest was written, else its
        checkpoint goes back into quarantine (never through an unsafe one)."""
        manifest = read_manifest(stage)
        if manifest and manifest.ok and manifest.file and (stage / manifest.file).exists():
            target = unique_path(self.root / name)
            os.rename(stage, target)
            fsync_dir(self.root)
            point_latest(self.root, target)
            return f"finished promotion of {target.name}"
        if not may_undo:
            return f"left {stage.name}: the quarantine is refused"
        self.ensure()
        for f in stage.iterdir():
            real = f.is_file() or f.is_dir()
            if real and not f.is_symlink() and not f.name.startswith(".") and f.name != MANIFEST:
                os.rename(f, unique_path(self.dir / f.name))
        shutil.rmtree(stage, ignore_errors=True)
        return f"undid promotion {stage.name}"

    def _files(self) -> list[Path]:
        if self.unsafe() is not None:
            return []
        try:
            return sorted(
                x
                for x in self.dir.iterdir()
                if x.is_file() and not x.name.startswith(".") and not x.name.endswith(_SIDE_SUFFIXES)
            )
        except FileNotFoundError:
            return []

    def candidates(self) -> list[Path]:
        """Candidates awaiting a verdict (a rejected one carries a .reason file)."""
        return [x for x in self._files() if not x.with_name(x.name + REASON_SUFFIX).exists()]

    def rejected(self) -> list[Path]:
        return [x for x in self._files() if x.with_name(x.name + REASON_SUFFIX).exists()]

    def reason(self, candidate: Path) -> str | None:
        try:
            return candidate.with_name(candidate.name + REASON_SUFFIX).read_text().strip() or None
        except OSError:
            return None

    def reject(self, candidate: Path, report: VerifyReport) -> Path:
        """Keep the candidate where it is, with why: the evidence for CKPT_REJECTED."""
        reason_path = candidate.with_name(candidate.name + REASON_SUFFIX)
        write_json_atomic(candidate.with_name(candidate.name + REPORT_SUFFIX), report)
        tmp = reason_path.with_name(f".{reason_path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{report.reason or 'rejected'}\n")
        os.replace(tmp, reason_path)
        with contextlib.suppress(OSError):
            fsync_dir(self.dir)
        return reason_path

    def sweep(self) -> list[str]:
        """Tidy what a killed writer left: its temp files go, a half-done promotion is finished
        (manifest written) or undone (file back into quarantine). Returns what it did."""
        done: list[str] = []
        refused = self.unsafe()
        if refused is not None:
            done.append(f"refused: {refused}")
        swept = [self.root] if refused is not None else [self.dir, self.root]
        for d in swept:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for x in d.iterdir():
                    m = re.match(r"^\..+\.(\d+)\.tmp$", x.name)
                    if not m or x.is_symlink() or pid_alive(int(m.group(1))):
                        continue
                    with contextlib.suppress(OSError):
                        if x.is_dir():  # a directory checkpoint's copy cut short
                            shutil.rmtree(x)
                        elif x.is_file():
                            x.unlink()
                        done.append(f"removed {x}")
        with contextlib.suppress(FileNotFoundError):
            for stage in self.root.iterdir():
                m = re.match(r"^\.promote-(step-\d+(?:-\d+)?)\.(\d+)$", stage.name)
                if not m or stage.is_symlink() or not stage.is_dir() or pid_alive(int(m.group(2))):
                    continue
                try:
                    done.append(self._settle_stage(stage, m.group(1), refused is None))
                except OSError as exc:  # a full disk: left for the next sweep, said
                    done.append(f"could not settle {stage.name}: {exc.strerror or exc}")
        if latest_dir(self.root) is None:
            # `latest` points nowhere (a promotion cut short before it moved it): the newest
            # verified checkpoint is the one a resume would want.
            verified = verified_checkpoints(self.root)
            if verified:
                with contextlib.suppress(OSError):
                    replace_latest(self.root, os.path.basename(verified[-1].dir))
                    done.append(f"pointed latest at {os.path.basename(verified[-1].dir)}")
        return done


# --------------------------------------------------------------------------- latest


def _read_pointer(root: Path) -> str | None:
    link = root / LATEST
    try:
        if link.is_symlink():
            return os.readlink(link)
        if link.is_file():
            return link.read_text().strip()
    except OSError:
        return None
    return None


def latest_dir(root: str | os.PathLike[str]) -> Path | None:
    """The step directory `latest` names, if it is a real, verified one inside the root."""
    root = Path(root)
    name = _read_pointer(root)
    if not name or "/" in name or not STEP_DIR_RE.match(name):
        return None
    d = root / name
    if d.is_symlink() or not d.is_dir():
        return None
    manifest = read_manifest(d)
    return d if manifest and manifest.ok else None


def latest_manifest(root: str | os.PathLike[str]) -> Manifest | None:
    d = latest_dir(root)
    return read_manifest(d) if d else None


def previous_verified(root: str | os.PathLike[str]) -> Previous | None:
    """The latest verified checkpoint as a new candidate under `root` is compared with it."""
    prev = latest_manifest(root)
    if prev is None:
        return None
    return Previous(path=prev.path, arch=prev.report.arch, stds=prev.report.stds)


def latest_checkpoint(root: str | os.PathLike[str] | None = None) -> Path | None:
    """What a resume should load: the newest verified checkpoint (a file, or a directory
    checkpoint kept as a verified copy), or None."""
    r = checkpoint_root(root)
    d = latest_dir(r)
    if d is None:
        return None
    manifest = read_manifest(d)
    f = d / manifest.file if manifest and manifest.file else None
    return f if f is not None and not f.is_symlink() and (f.is_file() or f.is_dir()) else None


def replace_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(name, tmp)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES):
            raise
        # A filesystem without symlinks gets a pointer file, written and renamed the same way.
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def point_latest(root: Path, target: Path) -> bool:
    """Move `latest` to `target` unless the current one was saved later (a late verdict on an
    older candidate must not roll `latest` back)."""
    new = read_manifest(target)
    cur = latest_manifest(root)
    if cur and cur.saved_at > (new.saved_at if new else 0.0):
        return False
    replace_latest(root, target.name)
    return True


def _step_dir(e: listing.Entry) -> bool:
    return bool(STEP_DIR_RE.match(e.name)) and e.is_dir and not e.is_symlink


def verified_checkpoints(root: str | os.PathLike[str]) -> list[VerifiedCheckpoint]:
    """Promoted checkpoints, oldest first (by save time, then step)."""
    root = Path(root)
    out: list[VerifiedCheckpoint] = []
    try:
        entries = listing.select(root, "step-dirs", _step_dir)  # cached while the root does not change
    except FileNotFoundError:
        return out
    for e in entries:
        m = STEP_DIR_RE.match(e.name)
        if not m:
            continue
        d = root / e.name
        manifest = read_manifest(d)
        if not manifest or not manifest.ok:
            continue
        out.append(
            VerifiedCheckpoint(
                dir=str(d),
                file=str(d / manifest.file),
                step=manifest.step if manifest.step is not None else int(m.group(1)),
                size_bytes=tree_bytes(d),
                saved_at=manifest.saved_at,
                digest=manifest.digest,
                pinned=(d / PIN).exists() or manifest.pinned,
            )
        )
    out.sort(key=lambda c: (c.saved_at, c.step, c.dir))
    return out


def pin(step_dir: str | os.PathLike[str], pinned: bool = True) -> None:
    """A pinned checkpoint is never pruned (the one a paper's numbers came from, say)."""
    marker = Path(step_dir) / PIN
    if pinned:
        marker.touch()
    else:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
