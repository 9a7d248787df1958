"""Length-prefixed msgpack frames on a stream: a 4-byte big-endian length, then that many bytes of
msgpack. A frame longer than the direction's limit, or a body that does not decode into the
direction's union, is a `ProtocolError` (the keeper closes that one connection); with `salvage_as`
a frame with one bad field is kept without it. The messages themselves are `protocol`'s."""

from __future__ import annotations

import struct
from typing import Any, Generic, TypeVar

import msgspec

from trainroom.core.wire.salvage import NotAMessage, RefusedField, salvage

HEADER = struct.Struct(">I")
# Trainer and client frames are small; a snapshot to a client can carry a long history.
MAX_INBOUND_FRAME = 1 << 20
MAX_OUTBOUND_FRAME = 64 << 20

_encoder = msgspec.msgpack.Encoder()


class ProtocolError(Exception):
    """A frame that must end its connection: too large, or not a message of this direction.
    `decoded` holds the whole messages that arrived before it in the same read: they are valid
    and are still handled (a bad frame loses nothing but itself)."""

    def __init__(self, message: str, decoded: list[Any] | None = None) -> None:
        super().__init__(message)
        self.decoded: list[Any] = decoded or []


T = TypeVar("T")


def encode(msg: object) -> bytes:
    return _encoder.encode(msg)


def frame(msg: object) -> bytes:
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


class FrameReader(Generic[T]):
    """Accumulates bytes from a stream and yields whole decoded messages. With `salvage_as` (the
    decoder's union), a frame with a bad field is kept without it and `refused` says what went."""

    def __init__(self, decoder: msgspec.msgpack.Decoder[T], max_frame: int, salvage_as: Any = None) -> None:
        self._decoder = decoder
        self._max = max_frame
        self._buf = bytearray()
        self._salvage_as = salvage_as
        self.refused: list[RefusedField] = []

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[T]:
        self._buf += data
        out: list[T] = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self._max:
                raise ProtocolError(f"frame of {n} bytes exceeds the limit of {self._max}", out)
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + n])
            del self._buf[: HEADER.size + n]
            try:
                out.append(self._decoder.decode(body))
            except msgspec.ValidationError as exc:
                if self._salvage_as is None:
                    raise ProtocolError(f"undecodable frame: {exc}", out) from None
                try:
                    msg, refused = salvage(body, self._salvage_as)
                except NotAMessage as bad:
                    raise ProtocolError(str(bad), out) from None
                self.refused += refused
                if msg is not None:
                    out.append(msg)
            except msgspec.DecodeError as exc:
                raise ProtocolError(f"undecodable frame: {exc}", out) from None
        return out
