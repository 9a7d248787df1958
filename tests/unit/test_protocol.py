"""Frames and records: round trips, limits, garbage, and the journal's torn tail."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from trainroom.core import protocol as p
from trainroom.core.run.journal import Journal, read_journal


def test_every_trainer_message_round_trips_through_a_frame() -> None:
    msgs = [
        p.Hello(
            pid=1,
            rank=2,
            world_size=4,
            config=p.RequestedConfig(lr=1e-4, vocab_size=50257, arch={"layers": 32}),
        ),
        p.Step(
            step=7,
            t=1.5,
            tokens=100,
            loss=2.5,
            grad_norm=float("inf"),
            lr=[1e-4, 2e-4],
            loss_scale=65536.0,
            alloc_allocated=1,
            alloc_reserved=2,
            alloc_peak=3,
        ),
        p.Heartbeat(t=2.0, phase="eval", main_frame="train.py:10 in step", main_frame_age_s=0.5, dropped=3),
        p.Phase(name="checkpoint-save", t=3.0, bound_s=120.0),
        p.Checkpoint(path="/x/step-000001.pt", step=1, t=4.0, size_bytes=10, digest="ab"),
        p.Crash(
            t=5.0,
            chain=[
                p.ErrorLink(type="SystemError", message="readinto"),
                p.ErrorLink(type="OSError", message="no mem", errno=12, errno_name="ENOMEM"),
            ],
        ),
        p.Note(kind="lr-reimposed", t=6.0, data={"old": 1e-6, "new": 1e-4}),
        p.Bye(t=7.0),
    ]
    reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
    data = b"".join(p.frame(m) for m in msgs)
    got = []
    for i in range(0, len(data), 7):  # arbitrary chunking: frames split across reads
        got += reader.feed(data[i : i + 7])
    assert got[1].grad_norm == float("inf")
    assert [type(m) for m in got] == [type(m) for m in msgs]
    assert got[0] == msgs[0] and got[5] == msgs[5]


def test_oversized_length_prefix_is_refused_before_reading_the_body() -> None:
    reader = p.FrameReader(p.inbound_decoder, 1024)
    with pytest.raises(p.ProtocolError, match="exceeds the limit of 1024"):
        reader.feed(struct.pack(">I", 1025))


def test_garbage_and_wrong_direction_messages_are_protocol_errors() -> None:
    reader = p.FrameReader(p.inbound_decoder, 1024)
    with pytest.raises(p.ProtocolError, match="undecodable"):
        reader.feed(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    reader = p.FrameReader(p.inbound_decoder, 1024)
    with pytest.raises(p.ProtocolError):  # a keeper->client message is not inbound
        reader.feed(p.frame(p.Reply(id=1, action="kill", stage="done")))
    reader = p.FrameReader(p.inbound_decoder, 1024)
    with pytest.raises(p.ProtocolError):  # a Step without its required step field
        reader.feed(p.frame({"type": "step", "t": 1.0}))


def test_journal_ignores_a_torn_tail_and_keeps_everything_before(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    j = Journal(path)
    for i in range(10):
        j.append(p.KeeperNote(t=float(i), message=f"n{i}"))
    j.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # the keeper died mid-write
    got = list(read_journal(path))
    assert [r.message for r in got] == [f"n{i}" for i in range(9)]
    # A flipped byte in the last record's body fails its CRC: that record and after are dropped.
    b = bytearray(whole)
    b[-2] ^= 0xFF
    path.write_bytes(bytes(b))
    assert len(list(read_journal(path))) == 9
    assert list(read_journal(tmp_path / "missing")) == []
