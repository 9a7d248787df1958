"""The run's append-only journal: each record is a length, a CRC32 and a msgpack body.

A crash of the keeper can tear the last record; a reader stops at the first record whose length
or checksum does not hold, so a torn tail is ignored and everything before it is kept.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainroom.core import protocol as p

_HEAD = struct.Struct(">II")  # body length, crc32 of the body
MAX_RECORD = 16 << 20


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "ab", buffering=1 << 16)  # noqa: SIM115 - open for the keeper's lifetime

    def append(self, rec: Any) -> None:
        body = p.encode(rec)
        self._f.write(_HEAD.pack(len(body), zlib.crc32(body)) + body)

    def flush(self, fsync: bool = False) -> None:
        self._f.flush()
        if fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        try:
            self.flush(fsync=True)
        finally:
            self._f.close()


def read_journal(path: Path) -> Iterator[Any]:
    """Yield every whole record; stop quietly at a torn or corrupt tail."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    off = 0
    while off + _HEAD.size <= len(data):
        n, crc = _HEAD.unpack_from(data, off)
        start = off + _HEAD.size
        if n > MAX_RECORD or start + n > len(data):
            return
        body = data[start : start + n]
        if zlib.crc32(body) != crc:
            return
        try:
            yield p.record_decoder.decode(body)
        except Exception:  # a record of a newer version: skip it, keep the rest
            pass
        off = start + n
