"""The trainer's save: a checkpoint written into quarantine, announced to the keeper, promoted
only once verified.

    from trainroom.core.sdk import save_checkpoint
    save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": it}, step=it)

`torch.save` is not atomic and Lightning's atomic save does not fsync: a save here writes a temp
file in the quarantine directory itself (a rename across filesystems would be a copy), hashing the
bytes on their way to disk, fsyncs the file, renames it, fsyncs the directory. The layout is
`ckpt.layout`'s. Torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import msgspec

from trainroom.core.ckpt import digest as digest
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import promote as promote
from trainroom.core.ckpt.verify import verify
from trainroom.core.health import diskguard as diskguard
from trainroom.core.sdk import replay as replay
from trainroom.core.sdk import reporter as reporter
from trainroom.core.vocab import CkptState

# Bytes the checkpoint root may hold (`launch --disk-budget`); the keeper exports it to the trainer
# so the pre-save check refuses a checkpoint the budget cannot take.
ENV_BUDGET = "TRAINROOM_DISK_BUDGET"
# What torch.save adds around the tensor bytes: pickle, zip headers, 64-byte alignment.
SAVE_OVERHEAD = 1 << 20

CheckpointWontFit = diskguard.CheckpointWontFit


class Saved(msgspec.Struct, kw_only=True, frozen=True):
    """What `save_checkpoint` did: the candidate, and (promoted inline) where it went."""

    path: str  # the candidate in quarantine (where it was written)
    step: int
    size_bytes: int
    digest: str
    state: CkptState = "candidate"  # still a candidate when its verification was deferred
    promoted: str | None = None  # the step directory, once verified
    file: str | None = None  # the checkpoint file now (inside the step directory once promoted)
    reason: str | None = None


class _DigestingWriter:
    """The file torch.save writes into: hashes the bytes on their way to disk (torch writes the
    archive front to back, so this is the digest of the file), and never drops a short write."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._hasher = digest.new_hasher()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
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
        return digest.digest_hex(self._hasher)


def estimate_bytes(state: object) -> int:
    """What torch.save of `state` will write: the tensor storages (a shared one once) plus overhead."""
    import torch

    seen: set[int] = set()
    walked: set[int] = set()  # containers by identity: shared references ("billion laughs") once
    total = 0
    count = 0
    stack: list[object] = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (Mapping, list, tuple)):
            if id(obj) in walked:
                continue
            walked.add(id(obj))
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


def _env_budget() -> int | None:
    raw = os.environ.get(ENV_BUDGET, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None  # a malformed budget is no budget; the keeper only ever exports an int


def _replay_redirect(root: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    """Outside a replay, `root`. In a process `trainroom replay` started, its scratch root whatever
    root the trainer names (a hard-coded output directory included): a replay never saves into the
    run it replays."""
    if not replay.in_replay():
        return root
    scratch = replay.scratch_root()
    if scratch is None:
        raise layout.CheckpointError(
            f"a replay ({replay.ENV_STEP} set) saves only into its scratch root ({replay.ENV_ROOT}), "
            "which is not set: start replays with `trainroom replay`"
        )
    if root is not None and Path(root).expanduser().absolute() != Path(scratch).absolute():
        print(
            f"trainroom: a replay saves into its scratch root {scratch}, not {root} (the run's checkpoints "
            "are left as they are)",
            file=sys.stderr,
            flush=True,
        )
    return scratch


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
    state: object,
    step: int,
    root: str | os.PathLike[str] | None = None,
    *,
    promote_inline: bool | None = None,
    declared_arch: Mapping[str, object] | None = None,
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
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be an integer >= 0, got {step!r}")
    import torch

    r = layout.checkpoint_root(_replay_redirect(root))
    q = layout.Quarantine(r)
    q.ensure()  # CheckpointError for a quarantine that is a link out of the root
    q.sweep()  # what an earlier, killed save left behind
    need = estimate_bytes(state)
    if budget_bytes is None:
        budget_bytes = _env_budget()
    rep = reporter.current()
    try:
        diskguard.check_fit(
            q.dir, need, statvfs=statvfs, reserve_bytes=reserve_bytes, budget_bytes=budget_bytes, root=r
        )
    except diskguard.CheckpointWontFit as exc:
        # The keeper counts and names the saves skipped (DISK_FULL_SOON): tell it this one.
        rep.note(diskguard.SKIPPED_NOTE, str(exc.strerror), step=step)
        raise
    final = layout.unique_path(q.dir / layout.candidate_name(step))
    tmp = q.dir / f".{final.name}.{os.getpid()}.tmp"
    with rep.phase("checkpoint-save"):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as raw:
                w = _DigestingWriter(raw)
                torch.save(state, w)
                raw.flush()
                os.fsync(raw.fileno())
            layout.write_json_atomic(
                Path(str(final) + layout.SAVED_SUFFIX),
                layout.SaveRecord(
                    step=step, size_bytes=w.size, digest=w.digest, saved_at=time.time(), pid=os.getpid()
                ),
            )
            os.rename(tmp, final)
            layout.fsync_dir(q.dir)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            with contextlib.suppress(FileNotFoundError):
                if not final.exists():
                    Path(str(final) + layout.SAVED_SUFFIX).unlink()
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
    report = verify(final, promote.expected_for(r, declared_arch, final))
    record = promote.settle(final, report, r)
    saved = msgspec.structs.replace(saved, state=record.state, reason=record.reason)
    if record.state == "verified" and record.report is not None:
        saved = msgspec.structs.replace(
            saved, promoted=record.report.promoted_dir, file=record.report.promoted_file
        )
    elif record.state == "rejected":
        print(
            f"trainroom: checkpoint step {step} rejected, kept in quarantine: {record.reason}",
            file=sys.stderr,
        )
    return saved
