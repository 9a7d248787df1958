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
"""

from __future__ import annotations

import errno as errno_mod
import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from trainroom.core import protocol as p

_HEAD = struct.Struct(">II")  # body length, crc32 of the body
MAX_RECORD = 16 << 20
BACKLOG_BYTES = 64 << 20


def _frame(rec: p.Record) -> bytes:
    body = p.encode(rec)
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


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


def _resync(data: bytes | memoryview, off: int) -> int:
    """The next offset after `off` where a whole record starts (len(data) when none does)."""
    for j in range(off + 1, len(data) - _HEAD.size + 1):
        if _record_at(data, j) is not None:
            return j
    return len(data)


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
        self._size = self._repair()

    def _repair(self) -> int:
        """Cut a torn tail off (a keeper that died mid-write): appending after it would bury
        whole records behind garbage. Damage before the tail is left for readers to skip."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return os.fstat(self._fd).st_size
        last_good = _last_record_end(data)
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


def _last_record_end(data: bytes) -> int:
    """The end of the last whole record (0 when there is none)."""
    off = end_of_last = 0
    while off < len(data):
        end = _record_at(data, off)
        if end is None:
            off = _resync(data, off)
            continue
        off = end_of_last = end
    return end_of_last


def read_journal(path: Path) -> Iterator[p.Record]:
    """Every whole record, in order; a damaged stretch is skipped and reported in its place as a
    `JournalDamaged` record. A record of a newer version that does not decode is skipped too
    (counted in the damage report as unknown, not as damaged bytes)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    off = 0
    while off < len(data):
        end = _record_at(data, off)
        if end is None:
            nxt = _resync(data, off)
            yield p.JournalDamaged(offset=off, skipped_bytes=nxt - off, torn_tail=nxt == len(data))
            off = nxt
            continue
        try:
            yield p.record_decoder.decode(data[off + _HEAD.size : end])
        except (msgspec.DecodeError, msgspec.ValidationError):
            yield p.JournalDamaged(offset=off, skipped_bytes=0, unknown_records=1)
        off = end
