"""Folded snapshots of a run: its view (state and plot series) at a named point of its journal.

The keeper writes one every `[journal] snapshot_records` records, and at exit, beside the
journal: `snapshot.msgpack`, the one before it kept as `snapshot.prev.msgpack`. Each is written
to a temporary file, fsynced, then renamed over the newest (the newest first becomes the previous
one), so at every moment at least one whole snapshot is on disk. A reader takes the newest one
that verifies and replays only the journal after its offset.

A snapshot is trusted only when it matches the journal as it is now: its checksum holds, it
names the journal segment that is active, and the record it says ends at its offset is there,
whole, with the same CRC32. Otherwise (damaged, a journal cut back behind it, a segment sealed
since) it is passed over: the journal stays the source of truth.

A view is stored as the bytes its fold encodes (`fold.Fold`), as a segment's `JournalBase` does.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import msgspec

from trainroom.core.journal import file as journal

SNAPSHOT_NAME = "snapshot.msgpack"
PREVIOUS_NAME = "snapshot.prev.msgpack"
VERSION = 1
_HEAD = struct.Struct(">II")  # body length, crc32 of the body
_MAGIC = b"TRSNAP"


class SnapshotError(ValueError):
    """A snapshot or a base that does not decode into a view (raised by a fold's `decode`)."""


class Position(msgspec.Struct, kw_only=True, frozen=True):
    """Where in the journal a fold ends: the records before `offset` of the segment `segment`."""

    segment: str  # the id of the segment ("" for the first, which has no base)
    seq: int = 0
    offset: int
    # (offset, crc32) of the last record before `offset`; None when the fold ends at the
    # segment's start (its base included).
    last: tuple[int, int] | None = None
    records: int = 0  # records folded in all, every segment


class Snapshot(msgspec.Struct, kw_only=True):
    v: int = VERSION
    t: float
    position: Position
    view: bytes  # the fold's encoding of its view (fold.Fold.encode)


_snap_encoder = msgspec.msgpack.Encoder()
_snap_decoder = msgspec.msgpack.Decoder(Snapshot)


def fsync_dir(d: Path) -> None:
    """Make renames in `d` durable (a crash after them must not bring the old names back)."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(run_dir: Path, snap: Snapshot, hold: Callable[[], None] | None = None) -> int:
    """Write `snap` as the newest snapshot (the newest so far becomes the previous one); the
    bytes written. `hold`, for tests, is called with half the temporary file written."""
    body = _snap_encoder.encode(snap)
    data = _MAGIC + _HEAD.pack(len(body), zlib.crc32(body)) + body
    tmp = run_dir / (SNAPSHOT_NAME + ".tmp")
    with open(tmp, "wb") as f:
        if hold is not None:
            f.write(data[: len(data) // 2])
            f.flush()
            hold()
            f.write(data[len(data) // 2 :])
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    newest = run_dir / SNAPSHOT_NAME
    if newest.exists():
        os.replace(newest, run_dir / PREVIOUS_NAME)
    os.replace(tmp, newest)
    fsync_dir(run_dir)
    return len(data)


def read(path: Path) -> Snapshot | None:
    """The snapshot in `path` when it is whole and its checksum holds, else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + _HEAD.size
    if len(data) < head or not data.startswith(_MAGIC):
        return None
    n, crc = _HEAD.unpack_from(data, len(_MAGIC))
    body = data[head:]
    if len(body) != n or zlib.crc32(body) != crc:
        return None
    try:
        snap = _snap_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return snap if snap.v == VERSION else None


def candidates(run_dir: Path) -> list[Snapshot]:
    """The snapshots that are whole, newest first (at most two)."""
    found = [read(run_dir / name) for name in (SNAPSHOT_NAME, PREVIOUS_NAME)]
    return [s for s in found if s is not None]


def fits(pos: Position, segment_path: Path, segment: str, base_end: int) -> bool:
    """Whether a fold that ends at `pos` is a fold of this journal segment as it is now."""
    if pos.segment != segment:
        return False
    try:
        size = segment_path.stat().st_size
    except OSError:
        return False
    if pos.offset > size:
        return False  # the journal was cut back behind it
    if pos.last is None:
        return pos.offset == base_end
    return journal.record_crc_at(segment_path, pos.last[0]) == (pos.offset, pos.last[1])
