"""Snapshots of a run's fold: written atomically in two generations, trusted only when they match
the journal, and a replay from one ends exactly where a replay from the start ends."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import msgspec

from tests.support.synthetic import make_run_dir, run_records, view_bytes, write_run
from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.journal import replay, snapshot
from trainroom.core.journal.file import read_journal
from trainroom.core.journal.writer import JournalWriter
from trainroom.core.run import store
from trainroom.core.run.series import Series
from trainroom.core.wire import protocol as p

SMALL = JournalPolicy(snapshot_records=1000, batch_rows=128)


def _full_replay(run_dir: Path, rec: store.RunRecord) -> tuple[bytes, bytes]:
    """Every record of the active segment from its first byte: no snapshot, no shortcut."""
    view = store.empty_view(rec)
    for r in read_journal(run_dir / "journal.msgpack"):
        view.apply(r)
    return view_bytes(view)


def _load(run_dir: Path, rec: store.RunRecord) -> replay.Loaded:
    return replay.load(run_dir, store.fold_of(rec))


def test_a_replay_from_the_snapshot_ends_where_a_full_replay_ends(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    live, w = write_run(d, rec, run_records(3000, ranks=3), SMALL)
    assert w.stats.snapshots >= 5 and w.stats.batches > 0
    loaded = _load(d, rec)
    assert loaded.source == "snapshot" and loaded.tail_records == 0  # the close wrote the last one
    assert view_bytes(loaded.view) == _full_replay(d, rec)
    # ... and both are what the keeper folded live: the batching keeps the records' order.
    assert view_bytes(loaded.view) == view_bytes(live)


def test_a_snapshot_in_the_middle_plus_its_tail_equals_the_full_replay(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    records = list(run_records(3000, ranks=2))
    policy = JournalPolicy(snapshot_records=5000, batch_rows=128)
    _live, w = write_run(d, rec, records, policy, close=False)
    w.flush()
    w.journal.flush(fsync=True)  # the tail is on disk, the last snapshot well behind: a keeper killed here
    assert w.stats.snapshots == 1
    loaded = _load(d, rec)
    assert loaded.source == "snapshot" and loaded.tail_records > 100
    assert view_bytes(loaded.view) == _full_replay(d, rec)


def test_the_newest_of_two_generations_and_a_half_written_one_is_ignored(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    _live, _w = write_run(d, rec, run_records(2000, ranks=2), SMALL)
    newest = snapshot.read(d / snapshot.SNAPSHOT_NAME)
    prev = snapshot.read(d / snapshot.PREVIOUS_NAME)
    assert newest is not None and prev is not None
    assert prev.position.offset < newest.position.offset
    # A crash in the middle of the next write leaves half a temporary file: never read.
    (d / (snapshot.SNAPSHOT_NAME + ".tmp")).write_bytes((d / snapshot.SNAPSHOT_NAME).read_bytes()[:1000])
    assert [s.position for s in snapshot.candidates(d)] == [newest.position, prev.position]
    # A crash between the two renames leaves the previous one only: still read.
    os.replace(d / snapshot.SNAPSHOT_NAME, d / "aside")
    assert [s.position for s in snapshot.candidates(d)] == [prev.position]
    loaded = _load(d, rec)
    assert loaded.source == "snapshot" and loaded.tail_records > 0
    assert view_bytes(loaded.view) == _full_replay(d, rec)


def test_a_damaged_newest_snapshot_falls_back_to_the_one_before(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    write_run(d, rec, run_records(2000, ranks=2), SMALL)
    path = d / snapshot.SNAPSHOT_NAME
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert snapshot.read(path) is None
    prev = snapshot.read(d / snapshot.PREVIOUS_NAME)
    assert prev is not None
    loaded = _load(d, rec)
    assert loaded.source == "snapshot" and loaded.records == prev.position.records + loaded.tail_records
    assert view_bytes(loaded.view) == _full_replay(d, rec)
    # Both damaged: the journal from its start, the same run.
    prev_path = d / snapshot.PREVIOUS_NAME
    prev_path.write_bytes(prev_path.read_bytes()[:-10])
    loaded = _load(d, rec)
    assert loaded.source == "start" and view_bytes(loaded.view) == _full_replay(d, rec)


def test_a_snapshot_ahead_of_the_journal_or_of_another_journal_is_not_trusted(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    write_run(d, rec, run_records(1500, ranks=2), SMALL)
    journal = d / "journal.msgpack"
    newest = snapshot.read(d / snapshot.SNAPSHOT_NAME)
    assert newest is not None
    # The journal cut back behind both snapshots (a disk that lost its last writes): the
    # snapshots name records that are not there; the fold is the journal's, from its start.
    with open(journal, "r+b") as f:
        f.truncate(newest.position.offset // 3)
    loaded = _load(d, rec)
    assert loaded.source == "start" and view_bytes(loaded.view) == _full_replay(d, rec)
    # Another run's snapshots (a run dir copied together from two runs): they name records
    # this journal does not have where they say, so the fold is this journal's.
    other, orec = make_run_dir(tmp_path, "20260101-000001-other-beef")
    write_run(other, orec, run_records(1500, ranks=2, seed=99), SMALL)
    d2, rec2 = make_run_dir(tmp_path, "20260101-000002-third-cafe")
    write_run(d2, rec2, run_records(1500, ranks=2), SMALL)
    for name in (snapshot.SNAPSHOT_NAME, snapshot.PREVIOUS_NAME):
        shutil.copy(other / name, d2 / name)
    loaded = _load(d2, rec2)
    assert loaded.source == "start" and view_bytes(loaded.view) == _full_replay(d2, rec2)


def test_a_writer_reopening_a_run_goes_on_from_its_fold(tmp_path: Path) -> None:
    """A second keeper on the same run dir (or the same one restarted) continues the fold."""
    d, rec = make_run_dir(tmp_path)
    records = list(run_records(1200, ranks=2))
    half = len(records) // 2
    live, _w = write_run(d, rec, records[:half], SMALL)
    w2 = JournalWriter(d, store.fold_of(rec), SMALL)
    assert view_bytes(w2.view) == view_bytes(live)
    for r in records[half:]:
        live.apply(r)
        w2.append(r)
    w2.close()
    assert view_bytes(_load(d, rec).view) == view_bytes(live) == _full_replay(d, rec)


def test_records_a_write_failure_dropped_are_not_in_the_next_snapshot(tmp_path: Path) -> None:
    """Past the pending backlog, records are dropped (oldest first): the writer's fold must then
    be rebuilt from the file, so a snapshot never holds what the journal does not."""
    d, rec = make_run_dir(tmp_path)
    w = JournalWriter(d, store.fold_of(rec), SMALL, backlog_bytes=4096)
    records = list(run_records(600, ranks=2))
    os.chmod(d / "journal.msgpack", 0o400)
    real_write = os.write

    def failing_write(fd: int, data: bytes) -> int:  # a full disk for the journal's fd only
        if fd == w.journal._fd:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    os.write = failing_write  # type: ignore[assignment]
    try:
        for r in records[:400]:
            w.append(r)
            w.flush()
    finally:
        os.write = real_write  # type: ignore[assignment]
    assert w.health.dropped_records > 0
    for r in records[400:]:
        w.append(r)
    w.close()
    loaded = _load(d, rec)
    assert view_bytes(loaded.view) == _full_replay(d, rec)


def test_the_series_state_round_trips_and_folds_on_identically() -> None:
    rnd = random.Random(5)
    a = Series(max_buckets=16)
    for i in range(1, 300):
        a.observe_step(
            i,
            t=1000.0 + i,
            tokens=i * 10,
            loss=rnd.random(),
            lr=1e-3 if i < 150 else 1e-4,
            loss_scale=2.0**16,
        )
        if i == 120:
            a.mark("restart", label="attempt 2")
    b = Series.from_state(msgspec.msgpack.decode(msgspec.msgpack.encode(a.state()), type=type(a.state())))
    for s in (a, b):
        for i in range(300, 500):
            s.observe_step(
                i, t=1000.0 + i * 1.5, tokens=i * 10, loss=float(i % 7), lr=1e-5, loss_scale=2.0**15
            )
    assert msgspec.msgpack.encode(a.state()) == msgspec.msgpack.encode(b.state())
    assert a.snapshot() == b.snapshot()


def test_a_journal_without_snapshots_still_reads_whole(tmp_path: Path) -> None:
    """A run journaled before snapshots existed (one record per step): read from its start."""
    d, rec = make_run_dir(tmp_path)
    from trainroom.core.journal.file import Journal

    j = Journal(d / "journal.msgpack")
    view = store.empty_view(rec)
    for r in run_records(500, ranks=2):
        j.append(r)
        view.apply(r)
    j.close()
    loaded = _load(d, rec)
    assert loaded.source == "start" and view_bytes(loaded.view) == view_bytes(view)
    assert isinstance(next(read_journal(d / "journal.msgpack")), p.KeeperStarted)


def test_the_journal_keeps_the_order_records_came_in(tmp_path: Path) -> None:
    # A finding raised after step N stays after step N in the journal: batching steps moves
    # no other record ahead of them (what a reader of the history sees, and tests rely on).
    d, rec = make_run_dir(tmp_path)
    records = list(run_records(3000, ranks=2))
    assert any(isinstance(r, p.FindingRaised) for r in records)
    _live, w = write_run(d, rec, records, SMALL)
    assert w.stats.batches > 0
    assert [p.encode(r) for r in read_journal(d / "journal.msgpack")] == [p.encode(r) for r in records]
