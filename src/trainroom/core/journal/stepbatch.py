"""Step records as compressed columns: what the keeper journals instead of one record per step.

A `StepBatch` holds the consecutive step and heartbeat records of one attempt, every rank
interleaved, in the order they arrived. Each field of the steps becomes a column of 64-bit words
holding the difference from the row before (floats by their bit patterns, so the round trip is
exact to the bit, NaN payloads included: a time or a loss changes little from one row to the
next, and the difference of two nearby doubles' bit patterns is a small integer). Each column's
bytes are regrouped by significance (all first bytes, then all second bytes, ...), which turns
the zero high bytes of small differences into long runs, and the whole body is deflated (zlib).
Heartbeats (a few a second at most) are columns too, with the step row each came before; their
strings (phase, where the main thread is) are kept once per batch in a table.

`decode` gives back the very `Received` records `encode` was given, in the same order: the fold
of a journal with batches is the fold of one without them.
"""

from __future__ import annotations

import itertools
import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence

import msgspec

from trainroom.core.vocab import RateSource, StepSource
from trainroom.core.wire import protocol as p

CODEC = 1
MASK = (1 << 64) - 1
LEVEL = 6  # zlib: 1 costs ~15% more bytes, 9 is five times slower for under 1% fewer
SOURCE_CODES: dict[str, int] = {"reporter": 0, "log": 1}
SOURCE_NAMES: dict[int, StepSource] = {0: "reporter", 1: "log"}
RATE_FROM_CODES: dict[str | None, int] = {None: 0, "iteration times": 1, "bar rate": 2, "timestamps": 3}
RATE_FROM_NAMES: dict[int, RateSource | None] = {
    0: None,
    1: "iteration times",
    2: "bar rate",
    3: "timestamps",
}


class BatchError(ValueError):
    """A batch that does not decode (a newer codec, or damage the CRC did not catch)."""


class _Body(msgspec.Struct, kw_only=True, omit_defaults=True):
    cols: dict[str, bytes] = {}
    # Optional columns: a bitmap of the rows that lack the value (absent when every row has it;
    # the column itself is absent when no row has it).
    missing: dict[str, bytes] = {}
    strings: list[str] = []  # the heartbeats' phases and frames, each once


_body_encoder = msgspec.msgpack.Encoder()
_body_decoder = msgspec.msgpack.Decoder(_Body)

# The deflate dictionary: a body's skeleton (its column names, a heartbeat's keys), so a batch of
# a few rows, a slow run's, does not pay for them each time. Part of codec 1 as it stands:
# changing one byte makes every batch written with it unreadable (a new one is codec 2).
_ZDICT = bytes.fromhex(
    "83a4636f6c73de0016a472616e6bc41000000000000000000000000000000000a473746570c410000000000000000000"
    "00000000000000a174c41000000000000000000000000000000000a26d74c41000000000000000000000000000000000"
    "a6746f6b656e73c41000000000000000000000000000000000af616c6c6f635f616c6c6f6361746564c4100000000000"
    "0000000000000000000000ae616c6c6f635f7265736572766564c41000000000000000000000000000000000aa616c6c"
    "6f635f7065616bc41000000000000000000000000000000000a46c6f7373c41000000000000000000000000000000000"
    "a9677261645f6e6f726dc41000000000000000000000000000000000aa6c6f73735f7363616c65c41000000000000000"
    "000000000000000000a46c725f6ec41000000000000000000000000000000000a26c72c4100000000000000000000000"
    "0000000000a6736f75726365c41000000000000000000000000000000000a5625f706f73c41000000000000000000000"
    "000000000000a6625f72616e6bc41000000000000000000000000000000000a3625f74c4100000000000000000000000"
    "0000000000a4625f6d74c41000000000000000000000000000000000a7625f7068617365c41000000000000000000000"
    "000000000000a7625f6672616d65c41000000000000000000000000000000000a5625f616765c4100000000000000000"
    "0000000000000000a9625f64726f70706564c41000000000000000000000000000000000a76d697373696e6785a6746f"
    "6b656e73c40100a9677261645f6e6f726dc40100aa6c6f73735f7363616c65c40100a7625f6672616d65c40100a5625f"
    "616765c40100a7737472696e677397a5747261696ea46576616ca464617461af636865636b706f696e742d73617665af"
    "636865636b706f696e742d6c6f6164ba747261696e2e70793a31303020696e20747261696e5f73746570b8747261696e"
    "2e70793a31303020696e203c6d6f64756c653e"
)


def _deflate(body: bytes) -> bytes:
    c = zlib.compressobj(LEVEL, zdict=_ZDICT)
    return c.compress(body) + c.flush()


def _inflate(data: bytes) -> bytes:
    d = zlib.decompressobj(zdict=_ZDICT)
    out = d.decompress(data) + d.flush()
    if not d.eof:
        raise zlib.error("a step batch cut short")
    return out


def batchable(rec: p.Record) -> bool:
    """A record a batch may hold: a trainer's step or heartbeat as the keeper took it in."""
    return isinstance(rec, p.Received) and isinstance(rec.msg, (p.Step, p.Heartbeat))


# --------------------------------------------------------------------------- words


def _shuffle(words: array[int]) -> bytes:
    raw = words.tobytes()
    return b"".join(raw[k::8] for k in range(8))


def _unshuffle(data: bytes, n: int) -> array[int]:
    if len(data) != 8 * n:
        raise BatchError(f"a column of {len(data)} bytes for {n} rows")
    raw = bytearray(8 * n)
    for k in range(8):
        raw[k::8] = data[k * n : (k + 1) * n]
    out = array("Q")
    out.frombytes(bytes(raw))
    return out


def _deltas(values: Iterable[int]) -> array[int]:
    """Each value's difference from the one before, modulo 2**64. A value outside [0, 2**64)
    could not come back as itself: OverflowError (the caller writes those records unbatched)."""
    out = array("Q")
    prev = 0
    for v in values:
        if type(v) is not int or not 0 <= v <= MASK:
            raise OverflowError(f"{v!r} is not a whole number in [0, 2**64)")
        out.append((v - prev) & MASK)
        prev = v
    return out


def _exact_floats(values: Iterable[float | None]) -> None:
    # An int where a float belongs would come back as a float: not the record it was.
    if any(v is not None and type(v) is not float for v in values):
        raise TypeError("a value that is not a float in a float column")


def _sums(deltas: array[int]) -> list[int]:
    acc = 0
    out = []
    for d in deltas:
        acc = (acc + d) & MASK
        out.append(acc)
    return out


def _bits(values: Sequence[float]) -> array[int]:
    out = array("Q")
    out.frombytes(array("d", values).tobytes())
    return out


def _floats(words: Sequence[int]) -> list[float]:
    return array("d", array("Q", words).tobytes()).tolist()


def _bitmap(flags: Sequence[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, f in enumerate(flags):
        if f:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _unbitmap(data: bytes, n: int) -> list[bool]:
    if len(data) != (n + 7) // 8:
        raise BatchError(f"a bitmap of {len(data)} bytes for {n} rows")
    return [bool(data[i >> 3] >> (i & 7) & 1) for i in range(n)]


# --------------------------------------------------------------------------- encode


class _Columns:
    """The body being built: whole columns, and optional ones with their gaps."""

    def __init__(self) -> None:
        self.body = _Body()

    def words(self, name: str, words: array[int]) -> None:
        self.body.cols[name] = _shuffle(words)

    def _gaps(self, name: str, values: Sequence[object]) -> bool:
        """Note which rows lack the value; False when none has it (no column at all)."""
        gaps = [v is None for v in values]
        if all(gaps):
            return False
        if any(gaps):
            self.body.missing[name] = _bitmap(gaps)
        return True

    def ints(self, name: str, values: Sequence[int | None]) -> None:
        if self._gaps(name, values):
            self.words(name, _deltas(0 if v is None else v for v in values))

    def floats(self, name: str, values: Sequence[float | None]) -> None:
        _exact_floats(values)
        if self._gaps(name, values):
            self.words(name, _deltas(_bits([0.0 if v is None else v for v in values])))


def _lr_words(rows: list[p.Step]) -> tuple[array[int], array[int]]:
    """Each row's LR count, and each LR as the difference from the same group's LR a row before."""
    lens = array("Q", (len(s.lr) for s in rows))
    flat = array("Q")
    last: list[int] = []
    for s in rows:
        if not s.lr:
            continue
        _exact_floats(s.lr)
        words = _bits(s.lr)
        for j, w in enumerate(words):
            flat.append((w - (last[j] if j < len(last) else 0)) & MASK)
        last = list(words)
    return lens, flat


def _beat_columns(cols: _Columns, beats: list[tuple[int, p.Received]]) -> None:
    msgs = [r.msg for _, r in beats if isinstance(r.msg, p.Heartbeat)]
    table: dict[str, int] = {}

    def ref(text: str) -> int:
        if text not in table:
            table[text] = len(table)
        return table[text]

    _exact_floats([r.t for _, r in beats])
    _exact_floats([h.t for h in msgs])
    arrival = _bits([r.t for _, r in beats])
    cols.words("b_pos", _deltas(pos for pos, _ in beats))
    cols.words("b_rank", _deltas(r.rank for _, r in beats))
    cols.words("b_t", _deltas(arrival))
    cols.words(
        "b_mt", array("Q", ((w - a) & MASK for w, a in zip(_bits([h.t for h in msgs]), arrival, strict=True)))
    )
    cols.words("b_phase", _deltas(ref(h.phase) for h in msgs))
    cols.ints("b_frame", [None if h.main_frame is None else ref(h.main_frame) for h in msgs])
    cols.floats("b_age", [h.main_frame_age_s for h in msgs])
    cols.ints("b_dropped", [h.dropped for h in msgs])
    cols.body.strings = list(table)


def encode(attempt: int, records: Sequence[p.Received]) -> p.StepBatch:
    """The batch of `records` (steps and heartbeats of `attempt`, in arrival order). Raises
    ValueError (OverflowError, TypeError) for a value the columns cannot hold exactly (a negative
    step from a log pattern): the caller journals those records one by one instead."""
    steps: list[p.Received] = []
    beats: list[tuple[int, p.Received]] = []  # (the step row it came before, the heartbeat)
    for r in records:
        if r.attempt != attempt:
            raise ValueError(f"a record of attempt {r.attempt} in a batch of attempt {attempt}")
        if isinstance(r.msg, p.Step):
            steps.append(r)
        elif isinstance(r.msg, p.Heartbeat):
            beats.append((len(steps), r))
        else:
            raise ValueError(f"a {type(r.msg).__name__} message in a step batch")
    msgs = [r.msg for r in steps if isinstance(r.msg, p.Step)]
    cols = _Columns()
    _exact_floats([r.t for r in steps])
    _exact_floats([s.t for s in msgs])
    arrival = _bits([r.t for r in steps])
    cols.words("rank", _deltas(r.rank for r in steps))
    cols.words("step", _deltas(s.step for s in msgs))
    cols.words("t", _deltas(arrival))
    # The trainer's clock, as the difference from the keeper's arrival time of the same row.
    cols.words(
        "mt", array("Q", ((w - a) & MASK for w, a in zip(_bits([s.t for s in msgs]), arrival, strict=True)))
    )
    cols.ints("tokens", [s.tokens for s in msgs])
    cols.ints("alloc_allocated", [s.alloc_allocated for s in msgs])
    cols.ints("alloc_reserved", [s.alloc_reserved for s in msgs])
    cols.ints("alloc_peak", [s.alloc_peak for s in msgs])
    cols.floats("loss", [s.loss for s in msgs])
    cols.floats("grad_norm", [s.grad_norm for s in msgs])
    cols.floats("loss_scale", [s.loss_scale for s in msgs])
    if any(s.lr for s in msgs):
        lens, flat = _lr_words(msgs)
        cols.words("lr_n", _deltas(lens))
        cols.body.cols["lr"] = _shuffle(flat)
    if any(s.source != "reporter" for s in msgs):
        cols.body.cols["source"] = bytes(SOURCE_CODES[s.source] for s in msgs)
    if any(s.rate is not None for s in msgs):  # a log step's pace by the trainer's own timing
        cols.floats("rate", [s.rate for s in msgs])
        cols.body.cols["rate_from"] = bytes(RATE_FROM_CODES[s.rate_from] for s in msgs)
    if beats:
        _beat_columns(cols, beats)
    data = _deflate(_body_encoder.encode(cols.body))
    return p.StepBatch(attempt=attempt, rows=len(steps), beats=len(beats), codec=CODEC, data=data)


# --------------------------------------------------------------------------- decode


def _column(body: _Body, name: str, n: int) -> list[int] | None:
    data = body.cols.get(name)
    return None if data is None else _sums(_unshuffle(data, n))


def _gaps(body: _Body, name: str, n: int) -> list[bool]:
    gaps = body.missing.get(name)
    return _unbitmap(gaps, n) if gaps is not None else [False] * n


def _ints(body: _Body, name: str, n: int) -> list[int | None]:
    words = _column(body, name, n)
    if words is None:
        return [None] * n
    return [None if g else v for g, v in zip(_gaps(body, name, n), words, strict=True)]


def _float_column(body: _Body, name: str, n: int) -> list[float | None]:
    words = _column(body, name, n)
    if words is None:
        return [None] * n
    return [None if g else v for g, v in zip(_gaps(body, name, n), _floats(words), strict=True)]


def _lrs(body: _Body, n: int) -> list[list[float]]:
    lens = _column(body, "lr_n", n)
    if lens is None:
        return [[] for _ in range(n)]
    flat = _unshuffle(body.cols.get("lr", b""), sum(lens))
    out: list[list[float]] = []
    last: list[int] = []
    k = 0
    for m in lens:
        if not m:
            out.append([])
            continue
        words = [(flat[k + j] + (last[j] if j < len(last) else 0)) & MASK for j in range(m)]
        k += m
        last = words
        out.append(_floats(words))
    return out


def _sources(body: _Body, n: int) -> list[StepSource]:
    data = body.cols.get("source")
    if data is None:
        return ["reporter"] * n
    if len(data) != n or any(c not in SOURCE_NAMES for c in data):
        raise BatchError(f"a source column of {len(data)} bytes for {n} rows")
    return [SOURCE_NAMES[c] for c in data]


def _rates_from(body: _Body, n: int) -> list[RateSource | None]:
    data = body.cols.get("rate_from")
    if data is None:
        return [None] * n
    if len(data) != n or any(c not in RATE_FROM_NAMES for c in data):
        raise BatchError(f"a rate_from column of {len(data)} bytes for {n} rows")
    return [RATE_FROM_NAMES[c] for c in data]


def _body(batch: p.StepBatch) -> _Body:
    if batch.codec != CODEC:
        raise BatchError(f"step batch codec {batch.codec} is newer than this reader ({CODEC})")
    try:
        return _body_decoder.decode(_inflate(batch.data))
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BatchError(f"step batch does not decode: {exc}") from None


def _steps(body: _Body, n: int) -> tuple[list[int], list[float], list[p.Step]]:
    """Each row's rank and arrival time, and its step message."""
    ranks, steps, arrival = (_column(body, c, n) for c in ("rank", "step", "t"))
    mt = body.cols.get("mt")
    if ranks is None or steps is None or arrival is None or mt is None:
        raise BatchError("a step batch without its rank, step or time columns")
    # The trainer's time is a difference from the same row's arrival time (not a running sum).
    trainer_t = _floats([(a + d) & MASK for a, d in zip(arrival, _unshuffle(mt, n), strict=True)])
    tokens, allocated, reserved, peak = (
        _ints(body, c, n) for c in ("tokens", "alloc_allocated", "alloc_reserved", "alloc_peak")
    )
    loss, grad_norm, loss_scale = (_float_column(body, c, n) for c in ("loss", "grad_norm", "loss_scale"))
    lrs = _lrs(body, n)
    sources = _sources(body, n)
    rates, rates_from = _float_column(body, "rate", n), _rates_from(body, n)
    msgs = [
        p.Step(
            step=steps[i],
            t=trainer_t[i],
            tokens=tokens[i],
            loss=loss[i],
            grad_norm=grad_norm[i],
            lr=lrs[i],
            loss_scale=loss_scale[i],
            alloc_allocated=allocated[i],
            alloc_reserved=reserved[i],
            alloc_peak=peak[i],
            source=sources[i],
            rate=rates[i],
            rate_from=rates_from[i],
        )
        for i in range(n)
    ]
    return ranks, _floats(arrival), msgs


def _beats(body: _Body, n: int, rows: int) -> list[tuple[int, int, float, p.Heartbeat]]:
    """(the step row it came before, rank, arrival time, heartbeat) of each heartbeat."""
    if not n:
        return []
    pos, ranks, arrival = (_column(body, c, n) for c in ("b_pos", "b_rank", "b_t"))
    mt, phases = body.cols.get("b_mt"), _column(body, "b_phase", n)
    if pos is None or ranks is None or arrival is None or mt is None or phases is None:
        raise BatchError("a step batch without its heartbeat columns")
    if any(b < a for a, b in itertools.pairwise(pos)) or pos[-1] > rows:
        raise BatchError("heartbeat positions out of order")
    # Interned: msgspec leaves out a field equal to its default by identity, and a phase of
    # "train" must encode as the original did.
    strings = [sys.intern(x) for x in body.strings]
    frames = _ints(body, "b_frame", n)
    if any(i >= len(strings) for i in phases) or any(f is not None and f >= len(strings) for f in frames):
        raise BatchError("a heartbeat string outside the batch's table")
    trainer_t = _floats([(a + d) & MASK for a, d in zip(arrival, _unshuffle(mt, n), strict=True)])
    ages = _float_column(body, "b_age", n)
    dropped = _ints(body, "b_dropped", n)
    arrival_t = _floats(arrival)
    return [
        (
            pos[i],
            ranks[i],
            arrival_t[i],
            p.Heartbeat(
                t=trainer_t[i],
                phase=strings[phases[i]],
                main_frame=strings[f] if (f := frames[i]) is not None else None,
                main_frame_age_s=ages[i],
                dropped=dropped[i] or 0,
            ),
        )
        for i in range(n)
    ]


def decode(batch: p.StepBatch) -> list[p.Received]:
    """The `Received` records the batch was made of, in their order."""
    body = _body(batch)
    ranks, arrival, msgs = _steps(body, batch.rows)
    beats = _beats(body, batch.beats, batch.rows)
    out: list[p.Received] = []
    a = batch.attempt
    k = 0
    for i, msg in enumerate(msgs):
        while k < len(beats) and beats[k][0] <= i:
            _pos, rank, t, beat = beats[k]
            out.append(p.Received(attempt=a, rank=rank, t=t, msg=beat))
            k += 1
        out.append(p.Received(attempt=a, rank=ranks[i], t=arrival[i], msg=msg))
    for _pos, rank, t, beat in beats[k:]:
        out.append(p.Received(attempt=a, rank=rank, t=t, msg=beat))
    return out
