"""Journal segments: the active `journal.msgpack` and the sealed ones behind it.

When the active segment reaches `[journal] segment_mib`, the keeper seals it: it becomes
`journal.NNNNNN.msgpack` (NNNNNN its sequence number, the first being 0) and a new active
segment starts with a `JournalBase` record holding the fold of everything before it. A reader
starts from the active segment and never needs the sealed ones; they are history.

Retention: a sealed segment older than `full_resolution_h`, or beyond `full_resolution_mib` of
sealed segments (newest kept first), is rewritten without its step records as
`journal.NNNNNN.lean.msgpack`: its attempts, findings, checkpoints, actions and notes stay, with
a note saying how many step records were let go. The plot of those steps lives on in the
min/max buckets every later base and snapshot carries.

Every change is a rename of a whole, fsynced file: a crash between two steps leaves either the
old layout or the new one, and the next keeper finishes or undoes what it finds half done.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import msgspec

from trainroom.core.journal import file as journal_mod
from trainroom.core.journal.snapshot import fsync_dir
from trainroom.core.journal.stepbatch import batchable
from trainroom.core.wire import protocol as p

ACTIVE_NAME = "journal.msgpack"
NEXT_NAME = "journal.msgpack.next"
_SEALED = re.compile(r"^journal\.(\d{6,})(\.lean)?\.msgpack$")


class Segment(msgspec.Struct, kw_only=True, frozen=True):
    seq: int
    path: str
    lean: bool  # its step records were let go (retention)
    size: int
    mtime: float


def sealed_name(seq: int, lean: bool = False) -> str:
    return f"journal.{seq:06d}{'.lean' if lean else ''}.msgpack"


def sealed(run_dir: Path) -> list[Segment]:
    """The sealed segments, oldest first; where a full one and its lean rewrite both exist (a
    crash between the two renames), the full one."""
    found: dict[int, Segment] = {}
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return []
    for e in entries:
        m = _SEALED.match(e.name)
        if m is None:
            continue
        try:
            st = e.stat()
        except OSError:
            continue
        seg = Segment(
            seq=int(m.group(1)), path=e.path, lean=bool(m.group(2)), size=st.st_size, mtime=st.st_mtime
        )
        prev = found.get(seg.seq)
        if prev is None or (prev.lean and not seg.lean):
            found[seg.seq] = seg
    return [found[k] for k in sorted(found)]


def base_of(path: Path) -> p.JournalBase | None:
    first = journal_mod.read_first(path)
    return first if isinstance(first, p.JournalBase) else None


def journal_bytes(run_dir: Path) -> int:
    """Bytes of the run's journal on disk: every segment, active and sealed."""
    total = 0
    for name in [ACTIVE_NAME, *(Path(s.path).name for s in sealed(run_dir))]:
        try:
            total += (run_dir / name).stat().st_size
        except OSError:
            pass
    return total


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def recover(run_dir: Path) -> None:
    """Undo a seal a crash cut short: the next segment was never put in place, so the active one
    is still the full one and any link of it under a sealed name goes."""
    nxt = run_dir / NEXT_NAME
    active = run_dir / ACTIVE_NAME
    if nxt.exists():
        nxt.unlink()
    for s in sealed(run_dir):
        if not s.lean and same_file(Path(s.path), active):
            os.unlink(s.path)
    for s in sealed(run_dir):
        lean = run_dir / sealed_name(s.seq, lean=True)
        if not s.lean and lean.exists():
            lean.unlink()  # a rewrite that did not finish: the full one is still there
    for tmp in run_dir.glob("journal.*.lean.msgpack.tmp"):
        tmp.unlink()


def seal(run_dir: Path, seq: int, base: p.JournalBase) -> None:
    """Put the active segment (sequence `seq`) behind a new one that starts with `base`. The
    caller has flushed and fsynced the active segment and reopens it afterwards."""
    active = run_dir / ACTIVE_NAME
    nxt = run_dir / NEXT_NAME
    body = p.encode(base)
    frame = journal_mod.frame_bytes(body)
    fd = os.open(nxt, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, frame)
        os.fsync(fd)
    finally:
        os.close(fd)
    target = run_dir / sealed_name(seq)
    if not same_file(target, active):
        os.link(active, target)
    os.replace(nxt, active)
    fsync_dir(run_dir)


class Stripped(msgspec.Struct, kw_only=True, frozen=True):
    seq: int
    full_bytes: int
    lean_bytes: int
    step_records: int


def strip(run_dir: Path, seg: Segment, now: float | None = None) -> Stripped:
    """Rewrite a sealed segment without its step and heartbeat records (they are in the plot's
    buckets of every later base): `journal.NNNNNN.lean.msgpack`, with a note of what went."""
    src = Path(seg.path)
    let_go = 0
    damaged = 0
    out: list[bytes] = []
    for _off, _end, rec in journal_mod.read_frames(src):
        if isinstance(rec, p.StepBatch):
            let_go += rec.rows + rec.beats
        elif batchable(rec):
            let_go += 1
        elif isinstance(rec, p.JournalDamaged):
            damaged += rec.skipped_bytes
        else:
            out.append(journal_mod.frame_bytes(p.encode(rec)))
    t = now if now is not None else time.time()
    what = f"retention: {let_go} step and heartbeat records of segment {seg.seq} let go (the plot keeps their buckets)"
    if damaged:
        what += f"; {damaged} damaged bytes skipped"
    out.append(journal_mod.frame_bytes(p.encode(p.KeeperNote(t=t, message=what, kind="retention"))))
    lean = run_dir / sealed_name(seg.seq, lean=True)
    tmp = lean.with_name(lean.name + ".tmp")
    data = b"".join(out)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.utime(tmp, (seg.mtime, seg.mtime))  # its age stays the age of its records
    os.replace(tmp, lean)
    os.unlink(src)
    fsync_dir(run_dir)
    return Stripped(seq=seg.seq, full_bytes=seg.size, lean_bytes=len(data), step_records=let_go)


def due_for_stripping(
    segments: list[Segment], now: float, full_resolution_s: float, full_resolution_bytes: int
) -> list[Segment]:
    """The full sealed segments retention lets go of: older than the window, or past the byte
    allowance counting from the newest."""
    out = []
    kept = 0
    for seg in sorted((s for s in segments if not s.lean), key=lambda s: s.seq, reverse=True):
        kept += seg.size
        if now - seg.mtime > full_resolution_s or kept > full_resolution_bytes:
            out.append(seg)
    return sorted(out, key=lambda s: s.seq)
