"""The compact step encoding: exact round trips, what the journal reader makes of batches, and
the bytes a step record takes."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path

import pytest

from tests.support.synthetic import f32, run_records
from trainroom.core.journal import stepbatch
from trainroom.core.journal.file import Journal, read_frames, read_journal
from trainroom.core.wire import protocol as p

T = 1_780_000_000.0


def _nan(payload: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0])


def _steps_of_every_shape() -> list[p.Received]:
    """Rows that exercise every column: gaps, non-finite values with payloads, LR lists that
    grow and shrink, the log source, integers at the top of uint64, heartbeats anywhere."""
    rnd = random.Random(3)
    out: list[p.Received] = [p.Received(attempt=4, rank=1, t=T, msg=p.Heartbeat(t=T, phase="data"))]
    for i in range(300):
        t = T + i * 0.05 + rnd.random() * 1e-3
        lr = [] if i % 5 == 0 else [1e-3 * math.cos(i / 50)] * (1 + i % 3)
        step = p.Step(
            step=i if i != 150 else 2**64 - 1,
            t=t - rnd.random() * 1e-3,
            tokens=None if i % 7 == 0 else i * 524288,
            loss=_nan(0x1234) if i == 33 else float("inf") if i == 34 else f32(3 - i / 200),
            grad_norm=None if i % 11 == 0 else rnd.random() * 10,
            lr=lr,
            loss_scale=65536.0 if i % 2 else None,
            alloc_allocated=None if i < 10 else 1 << 30,
            alloc_reserved=None if i < 10 else (1 << 31) + i,
            alloc_peak=None if i < 10 else 0,
            source="log" if i % 13 == 0 else "reporter",
        )
        out.append(p.Received(attempt=4, rank=i % 3, t=t, msg=step))
        if i % 40 == 0:
            beat = p.Heartbeat(t=t, main_frame=f"train.py:{i} in step", main_frame_age_s=0.5, dropped=i)
            out.append(p.Received(attempt=4, rank=i % 3, t=t, msg=beat))
    out.append(p.Received(attempt=4, rank=2, t=T + 99, msg=p.Heartbeat(t=T + 99)))
    return out


def _wire(recs: list[p.Received]) -> list[bytes]:
    # Bytes, not ==: a NaN is not equal to itself, and its payload must survive too.
    return [p.encode(r) for r in recs]


def test_a_batch_gives_back_exactly_the_records_it_was_made_of() -> None:
    recs = _steps_of_every_shape()
    batch = stepbatch.encode(4, recs)
    assert batch.rows == 300 and batch.beats == len(recs) - 300
    back = stepbatch.decode(p.record_decoder.decode(p.encode(batch)))  # type: ignore[arg-type]
    assert _wire(back) == _wire(recs)


def test_a_batch_of_heartbeats_alone_round_trips() -> None:
    beats = [p.Received(attempt=1, rank=r, t=T + r, msg=p.Heartbeat(t=T + r, phase="eval")) for r in range(3)]
    assert _wire(stepbatch.decode(stepbatch.encode(1, beats))) == _wire(beats)


def test_what_the_columns_cannot_hold_exactly_is_refused_not_bent() -> None:
    # A log pattern can capture a negative step; another attempt or message kind has no place.
    neg = p.Received(attempt=1, rank=0, t=T, msg=p.Step(step=-5, t=T))
    with pytest.raises((ValueError, OverflowError)):
        stepbatch.encode(1, [neg])
    # An int where a float belongs (a Step built by hand) would come back as a float.
    with pytest.raises(TypeError):
        stepbatch.encode(1, [p.Received(attempt=1, rank=0, t=T, msg=p.Step(step=1, t=T, loss=2))])
    with pytest.raises(ValueError):
        stepbatch.encode(1, [p.Received(attempt=2, rank=0, t=T, msg=p.Step(step=1, t=T))])
    with pytest.raises(ValueError):
        stepbatch.encode(1, [p.Received(attempt=1, rank=0, t=T, msg=p.Bye(t=T))])


def test_the_journal_reader_expands_batches_in_place(tmp_path: Path) -> None:
    recs = _steps_of_every_shape()
    path = tmp_path / "journal.msgpack"
    j = Journal(path)
    before, after = p.KeeperNote(t=T, message="before"), p.KeeperNote(t=T, message="after")
    j.append(before)
    j.append(stepbatch.encode(4, recs))
    j.append(after)
    j.close()
    assert _wire(list(read_journal(path))) == _wire([before, *recs, after])  # type: ignore[list-item]
    stored = [type(r).__name__ for _o, _e, r in read_frames(path)]
    assert stored == ["KeeperNote", "StepBatch", "KeeperNote"]


def test_a_batch_that_does_not_decode_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    j = Journal(path)
    good = stepbatch.encode(1, [p.Received(attempt=1, rank=0, t=T, msg=p.Step(step=1, t=T))])
    # Whole and checksummed, but its columns are not what its row count says (a newer writer's
    # bug, say): the CRC cannot catch that, the reader must.
    bad = p.StepBatch(attempt=1, rows=5, data=good.data)
    j.append(bad)
    j.append(good)
    j.close()
    got = list(read_journal(path))
    assert isinstance(got[0], p.JournalDamaged) and got[0].unknown_records == 1 and got[0].offset == 0
    assert isinstance(got[1], p.Received) and isinstance(got[1].msg, p.Step) and got[1].msg.step == 1


def test_a_batch_from_a_newer_codec_is_an_unknown_record_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    j = Journal(path)
    b = stepbatch.encode(1, [p.Received(attempt=1, rank=0, t=T, msg=p.Step(step=1, t=T))])
    j.append(p.StepBatch(attempt=1, rows=1, codec=99, data=b.data))
    j.close()
    (got,) = list(read_journal(path))
    assert isinstance(got, p.JournalDamaged) and got.unknown_records == 1


def test_a_step_record_takes_well_under_60_bytes_on_disk() -> None:
    """The issue's goal (<= 60 bytes per step record on disk), on a realistic batch: 8 ranks,
    float32 losses and grad norms, a decaying LR over two groups, allocator figures, heartbeats;
    against the same records one per frame as journaled before."""
    recs = [
        r
        for r in run_records(1024, ranks=8, attempts=1)
        if isinstance(r, p.Received) and stepbatch.batchable(r)
    ]
    steps = sum(1 for r in recs if isinstance(r.msg, p.Step))
    batched = 8 + len(p.encode(stepbatch.encode(1, recs)))  # the journal's length + CRC header, the record
    one_by_one = sum(8 + len(p.encode(r)) for r in recs)
    assert batched / steps <= 60
    assert one_by_one / batched >= 4, (one_by_one / steps, batched / steps)


# A batch as codec 1 wrote it (its deflate dictionary included): what journals on disk hold.
# Whatever the encoder becomes, this must keep decoding to these records.
CODEC_1_BATCH = bytes.fromhex(
    "85a474797065a57374657073a7617474656d707403a4726f777303a5626561747302a464617461c5012278bb8cb1a3"
    "0d6d93a16ec3301445af9d2aa0a8d0a4526986a216942dee070c960d6c63fb80f04895aac24ae551e9d8d0703e6178"
    "5f501632dcf42596f36cc7cf61bef1b3dfbde7e0475c417440e43351577388f0c14351e4153e6a2c5a8d4203197004"
    "fe809d89beaaebba6ddb6e52764a8a0eb9be7d4f5b4f50506353dd78ca10091656952774d16051a33d914184b7c79a"
    "fdcf75d1389e46343785a2f1ac8e888033bdc1a0a3e45dc6c63e20b47aff04d64b60bf07f217e08952f755021b9214"
    "cf8c5402c114257e2fa6287090295a559a8c3b926d3b4b518657ba042f87a2e018a648debd5fba1845bf398dd0a528"
    "b8ada5e834522427411069e8b8485d6b45ea82977ae0250c9eb4e0490bde6540ced0f73382b3edb1e9374aeafe0069"
    "c3fd65"
)


def test_a_codec_1_batch_on_disk_still_decodes() -> None:
    expected = [
        p.Received(
            attempt=3,
            rank=0,
            t=T + 0.5,
            msg=p.Heartbeat(
                t=T + 0.49, phase="eval", main_frame="train.py:7 in evaluate", main_frame_age_s=0.25
            ),
        ),
        p.Received(
            attempt=3,
            rank=0,
            t=T + 1.0,
            msg=p.Step(
                step=10,
                t=T + 0.999,
                tokens=40960,
                loss=2.5,
                grad_norm=0.75,
                lr=[3e-4, 3e-5],
                alloc_allocated=1 << 30,
                alloc_reserved=2 << 30,
                alloc_peak=3 << 30,
            ),
        ),
        p.Received(
            attempt=3, rank=1, t=T + 1.001, msg=p.Step(step=10, t=T + 1.0, loss=float("nan"), source="log")
        ),
        p.Received(
            attempt=3,
            rank=0,
            t=T + 2.0,
            msg=p.Step(step=11, t=T + 1.999, tokens=45056, loss=2.25, lr=[3e-4, 3e-5], loss_scale=1024.0),
        ),
        p.Received(attempt=3, rank=1, t=T + 2.5, msg=p.Heartbeat(t=T + 2.5, dropped=3)),
    ]
    batch = p.record_decoder.decode(CODEC_1_BATCH)
    assert isinstance(batch, p.StepBatch) and batch.codec == 1
    assert _wire(stepbatch.decode(batch)) == _wire(expected)
