"""The run's append-only journal: each record is a length, a CRC32 and a msgpack body.

Reading: every record whose length and checksum hold is kept. A damaged stretch (a flipped byte,
a torn tail after a crash, garbage) is skipped by resyncing to the next offset where a whole,
checksummed record starts, and reported in-stream as a `JournalDamaged` record, so a reader folds
"N bytes skipped here" like anything else and nothing after the damage is lost.

Writing (the keeper): records are held in memory until a flush writes them with one `write`;
a write that fails (ENOSPC on a full disk, EIO) is cut back to the last whole record
(ftruncate), so the file never holds a torn record, and the records stay pending, at most
`backlog_bytes` of them (oldest dropped first, counted), to be written when space returns. A
keeper opening a journal whose tail is torn truncates the tail before it appends.

Steps are journaled in batches (`StepBatch`, see `journal.stepbatch`); `read_journal` expands each
batch back into the records it holds, so a reader folds the same records the keeper folded.
`read_frames` gives the records as stored, with their offsets (snapshots, segments).
"""

from __future__ import annotations

import errno as errno_mod
import os
import stat
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from trainroom.core.journal import stepbatch
from trainroom.core.wire import protocol as p

_HEAD = struct.Struct(">II")  # body length, crc32 of the body
MAX_RECORD = 16 << 20
BACKLOG_BYTES = 64 << 20


def frame_bytes(body: bytes) -> bytes:
    """A record's encoded body as the journal stores it: length, CRC32, body."""
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def _frame(rec: p.Record) -> bytes:
    return frame_bytes(p.encode(rec))


# A record is a tagged msgspec Struct: a msgpack map whose first key is "type". Checking for that
# before the CRC keeps a resync through garbage cheap (a random offset almost never passes).
_TAG = b"\xa4type"


def _looks_like_record(data: bytes | memoryview, start: int, n: int) -> bool:
    if n < 1 + len(_TAG):
        return False
    first = data[start]
    head = 1 if 0x80 <= first <= 0x8F else 3 if first == 0xDE else 5 if first == 0xDF else 0
    return bool(head) and bytes(data[start + head : start + head + len(_TAG)]) == _TAG


def _record_at(data: bytes | memoryview, off: int) -> int | None:
    """The end offset of a whole, checksummed record starting at `off`, else None."""
    if off + _HEAD.size > len(data):
        return None
    n, crc = (int(x) for x in _HEAD.unpack_from(data, off))
    start = off + _HEAD.size
    if n > MAX_RECORD or start + n > len(data) or not _looks_like_record(data, start, n):
        return None
    if zlib.crc32(data[start : start + n]) != crc:
        return None
    return start + n


def _resync(data: bytes, off: int) -> int:
    """The next offset after `off` where a whole record starts (len(data) when none does).
    Only offsets a record's "type" key could follow are tried, found by `bytes.find`: a stretch
    of zeros or garbage is skipped at memory speed, not one offset at a time."""
    pos = off + 1 + _HEAD.size + 1
    while True:
        tag = data.find(_TAG, pos)
        if tag < 0:
            return len(data)
        for head in (5, 3, 1):  # the map's header: ascending record offsets
            j = tag - head - _HEAD.size
            if j > off and _record_at(data, j) is not None:
                return j
        pos = tag + 1


class NotAFile(OSError):
    """A journal path that is not a regular file (a FIFO, a directory, a device): never read,
    since a FIFO would block every reader and a device could be endless."""


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading, without blocking on a FIFO (O_NONBLOCK), once it is known to be
    a regular file; NotAFile when it is anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
            raise NotAFile(errno_mod.EINVAL, f"{path.name} is {kind}, not a journal file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class JournalHealth(msgspec.Struct, kw_only=True):
    """What the writer could not do: the last write error and what waits in memory."""

    error: str | None = None  # e.g. "ENOSPC: No space left on device"
    errno: int | None = None
    since: float | None = None
    pending_records: int = 0
    pending_bytes: int = 0
    dropped_records: int = 0  # beyond the backlog, oldest first
    truncated_bytes: int = 0  # a torn tail cut off when the journal was opened


class Journal:
    def __init__(self, path: Path, backlog_bytes: int = BACKLOG_BYTES) -> None:
        self.path = path
        self.backlog_bytes = backlog_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.health = JournalHealth()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._last: tuple[int, int] | None = None  # (offset, crc32) of the last whole record written
        self._size = self._repair()

    @property
    def size(self) -> int:
        """Bytes of whole records in the file (what is pending not counted)."""
        return self._size

    @property
    def pending(self) -> int:
        """Records waiting to be written (a failed write keeps them)."""
        return len(self._pending)

    @property
    def last_record(self) -> tuple[int, int] | None:
        """Where the last whole record starts and its CRC32: what a snapshot names so a reader
        can tell the journal it was taken of from another (or from a shorter one)."""
        return self._last

    def _repair(self) -> int:
        """Cut a torn tail off (a keeper that died mid-write): appending after it would bury
        whole records behind garbage. Damage before the tail is left for readers to skip."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return os.fstat(self._fd).st_size
        last_good, self._last = _last_record(data)
        if last_good < len(data):
            os.ftruncate(self._fd, last_good)
            self.health.truncated_bytes = len(data) - last_good
        return last_good

    def append(self, rec: p.Record) -> None:
        frame = _frame(rec)
        self._pending.append(frame)
        self._pending_bytes += len(frame)
        while self._pending_bytes > self.backlog_bytes and len(self._pending) > 1:
            dropped = self._pending.pop(0)
            self._pending_bytes -= len(dropped)
            self.health.dropped_records += 1

    def flush(self, fsync: bool = False) -> bool:
        """Write what is pending; False when the write failed (the records stay pending)."""
        if self._pending:
            data = b"".join(self._pending)
            try:
                written = 0
                while written < len(data):
                    written += os.write(self._fd, data[written:])
                if fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                self._failed(exc)
                return False
            last = self._pending[-1]
            self._last = (self._size + len(data) - len(last), int(_HEAD.unpack_from(last)[1]))
            self._size += len(data)
            self._pending.clear()
            self._pending_bytes = 0
        elif fsync:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._failed(exc)
                return False
        if self.health.error is not None:
            self.health = JournalHealth(
                dropped_records=self.health.dropped_records, truncated_bytes=self.health.truncated_bytes
            )
        return True

    def _failed(self, exc: OSError) -> None:
        # Whatever part of the batch reached the file ends in a torn record: cut back to the
        # last whole one, and keep the batch for the next try.
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            pass
        h = self.health
        name = errno_mod.errorcode.get(exc.errno or 0, "EIO")
        h.error = f"{name}: {exc.strerror or exc}"
        h.errno = exc.errno
        h.since = h.since or time.time()
        h.pending_records = len(self._pending)
        h.pending_bytes = self._pending_bytes

    def close(self) -> None:
        try:
            self.flush(fsync=True)
        finally:
            os.close(self._fd)


def _last_record(data: bytes) -> tuple[int, tuple[int, int] | None]:
    """The end of the last whole record (0 when there is none), and its (offset, crc32)."""
    off = end_of_last = 0
    last: tuple[int, int] | None = None
    while off < len(data):
        end = _record_at(data, off)
        if end is None:
            off = _resync(data, off)
            continue
        last = (off, int(_HEAD.unpack_from(data, off)[1]))
        off = end_of_last = end
    return end_of_last, last


def record_crc_at(path: Path, offset: int) -> tuple[int, int] | None:
    """The (end offset, crc32) of the whole record at `offset`, else None: one small read."""
    try:
        with open_regular(path) as f:
            f.seek(offset)
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                return None
            n, crc = (int(x) for x in _HEAD.unpack(head))
            if n > MAX_RECORD:
                return None
            body = f.read(n)
    except OSError:
        return None
    end = _record_at(head + body, 0)
    return (offset + end, crc) if end is not None else None


def read_first(path: Path) -> p.Record | None:
    """The first record of a journal when it is whole (a segment's base), else None."""
    found = record_crc_at(path, 0)
    if found is None:
        return None
    try:
        with open_regular(path) as f:
            data = f.read(found[0])
        return p.record_decoder.decode(data[_HEAD.size :])
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _read_from(path: Path, start: int) -> bytes | None:
    try:
        with open_regular(path) as f:
            if start:
                f.seek(start)
            return f.read()
    except FileNotFoundError:
        return None


def read_frames(path: Path, start: int = 0) -> Iterator[tuple[int, int, p.Record]]:
    """(offset, end, record) of every record as stored from `start` on (a batch stays a batch);
    damage is a `JournalDamaged` record spanning what was skipped."""
    data = _read_from(path, start)
    if data is None:
        return
    off = 0
    while off < len(data):
        end = _record_at(data, off)
        if end is None:
            nxt = _resync(data, off)
            damaged = p.JournalDamaged(
                offset=start + off, skipped_bytes=nxt - off, torn_tail=nxt == len(data)
            )
            yield start + off, start + nxt, damaged
            off = nxt
            continue
        try:
            rec: p.Record = p.record_decoder.decode(data[off + _HEAD.size : end])
        except (msgspec.DecodeError, msgspec.ValidationError):
            rec = p.JournalDamaged(offset=start + off, skipped_bytes=0, unknown_records=1)
        yield start + off, start + end, rec
        off = end


def expand(offset: int, rec: p.Record) -> list[p.Record]:
    """The records a stored record stands for: a batch's steps and heartbeats, else itself. A
    batch that does not decode counts as one unknown record (the damage report names it)."""
    if not isinstance(rec, p.StepBatch):
        return [rec]
    try:
        return list(stepbatch.decode(rec))
    except stepbatch.BatchError:
        return [p.JournalDamaged(offset=offset, skipped_bytes=0, unknown_records=1)]


def read_journal(path: Path, start: int = 0) -> Iterator[p.Record]:
    """Every whole record from `start` on, in order, batches expanded; a damaged stretch is
    skipped and reported in its place as a `JournalDamaged` record. A record of a newer version
    that does not decode is skipped too (counted in the damage report as unknown, not as damaged
    bytes)."""
    for off, _end, rec in read_frames(path, start):
        if isinstance(rec, p.StepBatch):
            yield from expand(off, rec)
        else:
            yield rec
