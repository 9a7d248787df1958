"""Checkpoints: written into quarantine, promoted only once verified, `latest` moved atomically.

    from trainroom.core.checkpoints import save_checkpoint
    save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": it}, step=it)

Layout under the checkpoint root (`TRAINROOM_CKPT_ROOT` unless given)::

    .quarantine/step-000300.pt             a candidate: fsynced, renamed into place, not trusted yet
    .quarantine/step-000300.pt.saved.json  size and digest taken while it was written
    .quarantine/step-000250.pt.reason      a rejected candidate stays, with why (and .verify.json)
    step-000200/step-000200.pt             promoted: verified, with manifest.json beside it
    latest -> step-000200                  a symlink (or a pointer file) replaced by rename

`torch.save` is not atomic and Lightning's atomic save does not fsync: a save here writes a temp
file in the quarantine directory itself (a rename across filesystems would be a copy), fsyncs the
file, renames it, fsyncs the directory. A promotion builds the step directory under a dot name,
renames it into place, then swaps `latest`: a kill at any moment leaves `latest` on a verified
checkpoint. Torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ckpt import verify as verifier
from trainroom.core.health import diskguard as diskguard
from trainroom.core.sdk import reporter as reporter

ENV_ROOT = "TRAINROOM_CKPT_ROOT"
# Bytes the checkpoint root may hold (`launch --disk-budget`); the keeper exports it to the trainer
# so the pre-save check refuses a checkpoint the budget cannot take.
ENV_BUDGET = "TRAINROOM_DISK_BUDGET"
QUARANTINE = ".quarantine"
LATEST = "latest"
MANIFEST = "manifest.json"
PIN = ".pinned"
SAVED_SUFFIX = ".saved.json"
REASON_SUFFIX = ".reason"
REPORT_SUFFIX = ".verify.json"
STEP_DIR_RE = re.compile(r"^step-(\d+)(?:-(\d+))?$")
_SIDE_SUFFIXES = (SAVED_SUFFIX, REASON_SUFFIX, REPORT_SUFFIX, ".tmp")
# What torch.save adds around the tensor bytes: pickle, zip headers, 64-byte alignment.
SAVE_OVERHEAD = 1 << 20
REPORT_KEYS = (
    "format",
    "tensors",
    "params",
    "dtypes",
    "nonfinite",
    "outliers",
    "arch",
    "stds",
    "model_key",
    "seconds",
    "step",
)


class CheckpointError(Exception):
    """A checkpoint operation that cannot go on; str() is one line."""


CheckpointWontFit = diskguard.CheckpointWontFit


class Saved(msgspec.Struct, kw_only=True):
    """What `save_checkpoint` did: the candidate, and (promoted inline) where it went."""

    path: str  # the candidate in quarantine (where it was written)
    step: int
    size_bytes: int
    digest: str
    state: str = "candidate"  # candidate | verified | rejected | deferred
    promoted: str | None = None  # the step directory, once verified
    file: str | None = None  # the checkpoint file now (inside the step directory once promoted)
    reason: str | None = None


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


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _unique(path: Path) -> Path:
    if not os.path.lexists(path):
        return path
    stem, suffix = (path.name[: -len(path.suffix)], path.suffix) if path.suffix else (path.name, "")
    for i in range(2, 10_000):
        cand = path.with_name(f"{stem}-{i}{suffix}")
        if not os.path.lexists(cand):
            return cand
    raise CheckpointError(f"no free name next to {path}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes under `path` by lstat, never following a symlink."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


class _DigestingWriter:
    """The file torch.save writes into: hashes the bytes on their way to disk (torch writes the
    archive front to back, so this is the digest of the file), and never drops a short write."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hasher = verifier.new_hasher()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        done = 0
        while done < len(view):
            n = self._raw.write(view[done:])
            if n is None or n <= 0:
                raise OSError(errno.EIO, "short write while saving a checkpoint")
            done += n
        self.size += done
        return done

    def flush(self) -> None:
        self._raw.flush()

    @property
    def digest(self) -> str:
        return verifier.digest_hex(self._hasher)


def estimate_bytes(state: Any) -> int:
    """What torch.save of `state` will write: the tensor storages (a shared one once) plus overhead."""
    import torch

    seen: set[int] = set()
    total = 0
    count = 0
    stack = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            count += 1
            st = obj.untyped_storage()
            if st.data_ptr() not in seen or st.data_ptr() == 0:
                seen.add(st.data_ptr())
                total += st.nbytes()
        elif isinstance(obj, Mapping):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total + SAVE_OVERHEAD + 128 * count


# --------------------------------------------------------------------------- quarantine


class Quarantine:
    """The candidates of one checkpoint root: written, not yet trusted."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.dir = self.root / QUARANTINE

    def _files(self) -> list[Path]:
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

    def reject(self, candidate: Path, report: Mapping[str, Any]) -> Path:
        """Keep the candidate where it is, with why: the evidence for CKPT_REJECTED."""
        reason_path = candidate.with_name(candidate.name + REASON_SUFFIX)
        write_json_atomic(candidate.with_name(candidate.name + REPORT_SUFFIX), verifier._clean(dict(report)))
        tmp = reason_path.with_name(f".{reason_path.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{report.get('reason') or 'rejected'}\n")
        os.replace(tmp, reason_path)
        with contextlib.suppress(OSError):
            fsync_dir(self.dir)
        return reason_path

    def sweep(self) -> list[str]:
        """Tidy what a killed writer left: its temp files go, a half-done promotion is finished
        (manifest written) or undone (file back into quarantine). Returns what it did."""
        done: list[str] = []
        for d, pattern in ((self.dir, r"^\..+\.(\d+)\.tmp$"), (self.root, r"^\..+\.(\d+)\.tmp$")):
            with contextlib.suppress(FileNotFoundError):
                for x in d.iterdir():
                    m = re.match(pattern, x.name)
                    if m and x.is_file() and not x.is_symlink() and not _pid_alive(int(m.group(1))):
                        with contextlib.suppress(OSError):
                            x.unlink()
                            done.append(f"removed {x}")
        with contextlib.suppress(FileNotFoundError):
            for stage in self.root.iterdir():
                m = re.match(r"^\.promote-(step-\d+(?:-\d+)?)\.(\d+)$", stage.name)
                if not m or stage.is_symlink() or not stage.is_dir() or _pid_alive(int(m.group(2))):
                    continue
                manifest = _read_json(stage / MANIFEST)
                if manifest and manifest.get("ok") and (stage / str(manifest.get("file"))).is_file():
                    target = _unique(self.root / m.group(1))
                    os.rename(stage, target)
                    fsync_dir(self.root)
                    _point_latest(self.root, target)
                    done.append(f"finished promotion of {target.name}")
                    continue
                self.dir.mkdir(exist_ok=True)
                for f in stage.iterdir():
                    if f.is_file() and not f.name.startswith(".") and f.name != MANIFEST:
                        os.rename(f, _unique(self.dir / f.name))
                shutil.rmtree(stage, ignore_errors=True)
                done.append(f"undid promotion {stage.name}")
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
    manifest = _read_json(d / MANIFEST)
    return d if manifest and manifest.get("ok") else None


def latest_manifest(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    d = latest_dir(root)
    return _read_json(d / MANIFEST) if d else None


def latest_checkpoint(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The file a resume should load: the newest verified checkpoint, or None."""
    r = checkpoint_root(root)
    d = latest_dir(r)
    if d is None:
        return None
    manifest = _read_json(d / MANIFEST) or {}
    f = d / str(manifest.get("file", ""))
    return f if f.is_file() else None


def _replace_latest(root: Path, name: str) -> None:
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


def _point_latest(root: Path, target: Path) -> bool:
    """Move `latest` to `target` unless the current one was saved later (a late verdict on an
    older candidate must not roll `latest` back)."""
    new = _read_json(target / MANIFEST) or {}
    cur = latest_manifest(root)
    if cur and float(cur.get("saved_at", 0)) > float(new.get("saved_at", 0)):
        return False
    _replace_latest(root, target.name)
    return True


def verified_checkpoints(root: str | os.PathLike[str]) -> list[VerifiedCheckpoint]:
    """Promoted checkpoints, oldest first (by save time, then step)."""
    root = Path(root)
    out: list[VerifiedCheckpoint] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return out
    for d in entries:
        m = STEP_DIR_RE.match(d.name)
        if not m or d.is_symlink() or not d.is_dir():
            continue
        manifest = _read_json(d / MANIFEST)
        if not manifest or not manifest.get("ok"):
            continue
        out.append(
            VerifiedCheckpoint(
                dir=str(d),
                file=str(d / str(manifest.get("file", ""))),
                step=int(manifest.get("step", m.group(1))),
                size_bytes=tree_bytes(d),
                saved_at=float(manifest.get("saved_at", 0.0)),
                digest=manifest.get("digest"),
                pinned=(d / PIN).exists() or bool(manifest.get("pinned")),
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


# --------------------------------------------------------------------------- promotion


def expected_for(
    root: str | os.PathLike[str],
    declared_arch: Mapping[str, Any] | None = None,
    candidate: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """What a new candidate is checked against: its save-time record, the declared config, and
    the latest verified checkpoint's fingerprint and stds."""
    out: dict[str, Any] = {}
    if candidate is not None:
        side = _read_json(Path(str(candidate) + SAVED_SUFFIX)) or {}
        out.update({k: side[k] for k in ("digest", "size_bytes", "step") if side.get(k) is not None})
    if declared_arch:
        out["arch"] = dict(declared_arch)
    prev = latest_manifest(root)
    if prev:
        rep = prev.get("report") or {}
        out["previous"] = {
            "path": prev.get("path", ""),
            "arch": rep.get("arch", {}),
            "stds": rep.get("stds", {}),
        }
    return out


def promote(
    candidate: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    *,
    file_name: str | None = None,
    step: int | None = None,
) -> Path:
    """Move a verified candidate to `<root>/step-NNNNNN/` with its manifest, then point `latest`
    at it. Refuses a report that did not pass or that names other bytes."""
    cand = Path(candidate)
    r = checkpoint_root(root) if root is not None else cand.parent.parent
    if not report.get("ok"):
        raise CheckpointError(f"{cand.name} did not verify ({report.get('reason')}): not promoting it")
    side = _read_json(Path(str(cand) + SAVED_SUFFIX)) or {}
    st = cand.stat()
    if report.get("size_bytes") not in (None, st.st_size):
        raise CheckpointError(f"{cand.name} changed since it was verified ({st.st_size} bytes now)")
    if step is None:
        step = report.get("step") if report.get("step") is not None else side.get("step")
    if step is None:
        m = re.search(r"(\d+)", cand.name)
        step = int(m.group(1)) if m else 0
    target = _unique(r / step_dir_name(int(step)))
    stage = r / f".promote-{target.name}.{os.getpid()}"
    stage.mkdir()
    fname = file_name or cand.name
    os.rename(cand, stage / fname)
    manifest = {
        "version": 1,
        "ok": True,
        "file": fname,
        "path": str(target / fname),
        "step": int(step),
        "size_bytes": st.st_size,
        "digest": report.get("digest") or side.get("digest"),
        "digest_algo": report.get("digest_algo", verifier.DIGEST_ALGO),
        "saved_at": float(side.get("saved_at", st.st_mtime)),
        "verified_at": time.time(),
        "source": str(side.get("source", cand)),
        "report": {k: report.get(k) for k in REPORT_KEYS if k in report},
    }
    write_json_atomic(stage / MANIFEST, verifier._clean(manifest))
    fsync_dir(stage)
    os.rename(stage, target)
    fsync_dir(r)
    for suffix in (SAVED_SUFFIX, REASON_SUFFIX, REPORT_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            Path(str(cand) + suffix).unlink()
    _point_latest(r, target)
    return target


def settle(
    candidate: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> p.CheckpointState:
    """Act on a verdict: promote a verified candidate, keep a rejected one in quarantine with its
    reason, leave a deferred one (verifier timed out, RAM short) as a candidate. Returns the
    record the keeper journals (path stays the candidate's; `report` says where it went)."""
    cand = Path(candidate)
    r = checkpoint_root(root) if root is not None else cand.parent.parent
    t = time.time() if now is None else now
    rep = dict(report)
    step = rep.get("step")
    if rep.get("ok"):
        target = promote(cand, rep, r)
        manifest = _read_json(target / MANIFEST) or {}
        rep["promoted_dir"], rep["promoted_file"] = str(target), manifest.get("path")
        return p.CheckpointState(
            path=str(cand),
            step=manifest.get("step", step),
            state="verified",
            t=t,
            size_bytes=rep.get("size_bytes"),
            digest=rep.get("digest"),
            report=_journal_report(rep),
        )
    if rep.get("deferred"):
        return p.CheckpointState(
            path=str(cand),
            step=step,
            state="candidate",
            t=t,
            reason=rep.get("reason"),
            size_bytes=rep.get("size_bytes"),
            digest=rep.get("digest"),
        )
    if cand.exists():
        Quarantine(r).reject(cand, rep)
    return p.CheckpointState(
        path=str(cand),
        step=step,
        state="rejected",
        t=t,
        reason=rep.get("reason"),
        size_bytes=rep.get("size_bytes"),
        digest=rep.get("digest"),
        report=_journal_report(rep),
    )


def _journal_report(rep: Mapping[str, Any]) -> dict[str, Any]:
    """The report without the per-tensor stds (they live in the manifest; the journal stays small)."""
    return verifier._clean({k: v for k, v in rep.items() if k != "stds"})


def keep_verified_copy(
    src: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> Path | None:
    """For a trainer that overwrites one file (nanoGPT's out/ckpt.pt): copy the version that just
    verified into the root and promote it. The copy's own digest must equal the verified one,
    else the trainer overwrote the file meanwhile and the copy is dropped (None)."""
    r = checkpoint_root(root)
    q = Quarantine(r)
    q.dir.mkdir(parents=True, exist_ok=True)
    src = Path(src)
    tmp = q.dir / f".{src.name}.{os.getpid()}.tmp"
    h = verifier.new_hasher()
    try:
        with open(src, "rb") as fi, open(tmp, "xb") as fo:
            while chunk := fi.read(verifier.READ_CHUNK):
                h.update(chunk)
                fo.write(chunk)
            fo.flush()
            os.fsync(fo.fileno())
        if verifier.digest_hex(h) != report.get("digest"):
            tmp.unlink()
            return None
        s = step if step is not None else report.get("step")
        cand = _unique(q.dir / (f"{step_dir_name(int(s))}-{src.name}" if s is not None else src.name))
        os.rename(tmp, cand)
        fsync_dir(q.dir)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    write_json_atomic(
        Path(str(cand) + SAVED_SUFFIX),
        {
            "step": s,
            "size_bytes": cand.stat().st_size,
            "digest": report.get("digest"),
            "digest_algo": verifier.DIGEST_ALGO,
            "saved_at": src.stat().st_mtime,
            "source": str(src),
        },
    )
    rep = {**report, "size_bytes": cand.stat().st_size}
    return promote(cand, rep, r, file_name=src.name, step=s)


# --------------------------------------------------------------------------- the SDK save


def _env_budget() -> int | None:
    raw = os.environ.get(ENV_BUDGET, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None  # a malformed budget is no budget; the keeper only ever exports an int


def _innermost_oserror(exc: BaseException) -> OSError | None:
    found: OSError | None = None
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno is not None:
            found = cur
        cur = cur.__cause__ or cur.__context__
    return found


def save_checkpoint(
    state: Any,
    step: int,
    root: str | os.PathLike[str] | None = None,
    *,
    promote_inline: bool | None = None,
    declared_arch: Mapping[str, Any] | None = None,
    statvfs: diskguard.StatvfsFn = os.statvfs,
    reserve_bytes: int | None = None,
    budget_bytes: int | None = None,
) -> Saved:
    """Save `state` (anything torch.save takes) as the candidate for `step`.

    Refuses first (CheckpointWontFit, an OSError with ENOSPC) when the checkpoint will not fit on
    the disk, or in the root's byte budget (`budget_bytes`, default `TRAINROOM_DISK_BUDGET`).
    Any failure while writing (ENOSPC included) removes the temp file and re-raises: nothing half
    written is left and `latest` is untouched. Under a keeper the keeper verifies and promotes
    (it gets a Checkpoint frame); otherwise (`promote_inline` None and no keeper, or True) this
    call verifies in-process and promotes or rejects before returning.
    """
    import torch

    r = checkpoint_root(root)
    q = Quarantine(r)
    q.dir.mkdir(parents=True, exist_ok=True)
    q.sweep()  # what an earlier, killed save left behind
    need = estimate_bytes(state)
    if budget_bytes is None:
        budget_bytes = _env_budget()
    diskguard.check_fit(
        q.dir, need, statvfs=statvfs, reserve_bytes=reserve_bytes, budget_bytes=budget_bytes, root=r
    )
    rep = reporter.current()
    final = _unique(q.dir / candidate_name(step))
    tmp = q.dir / f".{final.name}.{os.getpid()}.tmp"
    with rep.phase("checkpoint-save"):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as raw:
                w = _DigestingWriter(raw)
                torch.save(state, w)
                raw.flush()
                os.fsync(raw.fileno())
            write_json_atomic(
                Path(str(final) + SAVED_SUFFIX),
                {
                    "step": step,
                    "size_bytes": w.size,
                    "digest": w.digest,
                    "digest_algo": verifier.DIGEST_ALGO,
                    "saved_at": time.time(),
                    "pid": os.getpid(),
                },
            )
            os.rename(tmp, final)
            fsync_dir(q.dir)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            with contextlib.suppress(FileNotFoundError):
                if not final.exists():
                    Path(str(final) + SAVED_SUFFIX).unlink()
            inner = _innermost_oserror(exc)
            if inner is not None and inner is not exc:
                # torch.save's zip writer masks a failed write (ENOSPC) behind a RuntimeError from
                # its __exit__: raise what really happened.
                raise OSError(
                    inner.errno, f"{inner.strerror or inner} while saving checkpoint step {step} in {q.dir}"
                ) from exc
            raise
        rep.checkpoint(str(final), step, w.size, w.digest)
    saved = Saved(path=str(final), step=step, size_bytes=w.size, digest=w.digest, file=str(final))
    inline = (not rep.active) if promote_inline is None else promote_inline
    if not inline:
        return saved
    report = verifier.verify(final, expected_for(r, declared_arch, final))
    record = settle(final, report, r)
    saved.state, saved.reason = record.state, record.reason
    if record.state == "verified":
        saved.promoted = record.report.get("promoted_dir")
        saved.file = record.report.get("promoted_file")
    elif record.state == "rejected":
        print(
            f"trainroom: checkpoint step {step} rejected, kept in quarantine: {record.reason}",
            file=sys.stderr,
        )
    return saved
