"""Frames and records: round trips, limits, garbage, and the journal's torn tail."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from trainroom.core.journal.file import Journal, NotAFile, read_first, read_journal, record_crc_at
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p


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


def _notes(n: int) -> list[p.KeeperNote]:
    return [p.KeeperNote(t=float(i), message=f"n{i}") for i in range(n)]


def _write(path: Path, recs: list[p.KeeperNote]) -> bytes:
    j = Journal(path)
    for r in recs:
        j.append(r)
    j.close()
    return path.read_bytes()


def test_a_torn_tail_is_reported_and_everything_before_it_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    whole = _write(path, _notes(10))
    path.write_bytes(whole[:-3])  # the keeper died mid-write
    got = list(read_journal(path))
    assert [r.message for r in got[:-1]] == [f"n{i}" for i in range(9)]
    assert isinstance(got[-1], p.JournalDamaged) and got[-1].torn_tail
    assert got[-1].skipped_bytes == len(whole) - 3 - got[-1].offset
    assert list(read_journal(tmp_path / "missing")) == []


def test_a_flipped_byte_in_the_middle_loses_only_its_record(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    whole = _write(path, _notes(10))
    b = bytearray(whole)
    b[len(whole) // 2] ^= 0xFF
    path.write_bytes(bytes(b))
    got = list(read_journal(path))
    damaged = [r for r in got if isinstance(r, p.JournalDamaged)]
    kept = [r.message for r in got if isinstance(r, p.KeeperNote)]
    assert len(damaged) == 1 and not damaged[0].torn_tail and damaged[0].skipped_bytes > 0
    assert len(kept) == 9 and kept[0] == "n0" and kept[-1] == "n9"  # the records after it survive
    # The fold says so: every reader (status, the control room) reports it.
    st = RunState(run_id="r", argv=[], cwd="/", created=0.0)
    for r in got:
        st.apply(r)
    assert st.journal_damage.regions == 1 and st.journal_damage.skipped_bytes == damaged[0].skipped_bytes


def test_garbage_between_records_is_skipped_by_resyncing(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    first = _write(path, _notes(3))
    noise = bytes(range(256)) * 64  # 16 KiB of garbage, a stretch a bad disk or a stray write leaves
    second = _write(tmp_path / "second.msgpack", [p.KeeperNote(t=9.0, message="after")])
    path.write_bytes(first + noise + second)
    got = list(read_journal(path))
    assert [r.message for r in got if isinstance(r, p.KeeperNote)] == ["n0", "n1", "n2", "after"]
    (gap,) = [r for r in got if isinstance(r, p.JournalDamaged)]
    assert gap.offset == len(first) and gap.skipped_bytes == len(noise)


def test_a_keeper_opening_a_torn_journal_cuts_the_tail_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    whole = _write(path, _notes(5))
    path.write_bytes(whole[:-4])
    j = Journal(path)
    assert j.health.truncated_bytes > 0
    j.append(p.KeeperNote(t=99.0, message="appended"))
    j.close()
    got = list(read_journal(path))
    assert [r.message for r in got] == ["n0", "n1", "n2", "n3", "appended"]  # no damage left


def test_a_bad_field_is_left_out_and_named_the_rest_of_the_frame_kept() -> None:
    reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME, salvage_as=p.InboundMsg)
    hello = {"type": "hello", "pid": 5, "config": {"lr": "3e-4", "vocab_size": 0, "warmup_steps": 8}}
    step = {"type": "step", "step": 3, "t": 1.0, "tokens": -1, "loss": float("nan")}
    (h, s) = reader.feed(p.frame(hello) + p.frame(step))
    assert isinstance(h, p.Hello) and h.config.lr is None and h.config.warmup_steps == 8
    assert isinstance(s, p.Step) and s.step == 3 and s.tokens is None and s.loss != s.loss
    assert [(r.field, r.value, r.whole_frame) for r in reader.refused] == [
        ("hello.config.lr", "'3e-4'", False),
        ("hello.config.vocab_size", "0", False),
        ("step.tokens", "-1", False),
    ]
    # A required field cannot be left out: that frame goes, the reader goes on.
    reader.refused.clear()
    assert reader.feed(p.frame({"type": "step", "step": -1, "t": 1.0})) == []
    assert [(r.field, r.whole_frame) for r in reader.refused] == [("step.step", True)]
    assert (
        p.RequestedConfig(lr=0.0)
        == p.inbound_decoder.decode(p.encode(p.Hello(pid=1, config=p.RequestedConfig(lr=0.0)))).config
    )
    with pytest.raises(p.ProtocolError, match="bogus"):
        reader.feed(p.frame({"type": "bogus"}))


def test_a_stretch_of_zeros_and_stray_tags_is_skipped_to_the_next_record(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    first = _write(path, _notes(2))
    zeros = b"\0" * (8 << 20) + b"\x81\xa4type" * 1000  # a record's tag without a record around it
    second = _write(tmp_path / "second.msgpack", [p.KeeperNote(t=9.0, message="after")])
    path.write_bytes(first + zeros + second)
    got = list(read_journal(path))
    assert [r.message for r in got if isinstance(r, p.KeeperNote)] == ["n0", "n1", "after"]
    (gap,) = [r for r in got if isinstance(r, p.JournalDamaged)]
    assert gap.offset == len(first) and gap.skipped_bytes == len(zeros)


def test_a_journal_that_is_a_fifo_or_a_directory_is_refused_never_read(tmp_path: Path) -> None:
    fifo, folder = tmp_path / "fifo.msgpack", tmp_path / "dir.msgpack"
    os.mkfifo(fifo)  # opened plainly for reading, this blocks until a writer comes: never
    folder.mkdir()
    for path, kind in ((fifo, "a FIFO"), (folder, "a directory")):
        with pytest.raises(NotAFile, match=kind):
            list(read_journal(path))
        assert record_crc_at(path, 0) is None and read_first(path) is None
