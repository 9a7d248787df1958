"""Bounded growth: sealed segments, their bases, retention letting old steps go, and what a
crash in the middle of either leaves."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support.synthetic import make_run_dir, run_records, view_bytes, write_run
from trainroom.core.configuration.config import decode_config
from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.journal import replay, segments, snapshot
from trainroom.core.journal.file import read_frames, read_journal
from trainroom.core.journal.writer import JournalWriter
from trainroom.core.run import store
from trainroom.core.wire import protocol as p

# 64 KiB segments: a few thousand steps fill one.
SEGMENTED = JournalPolicy(snapshot_records=1000, batch_rows=64, segment_mib=0.0625)


def _load(d: Path, rec: store.RunRecord) -> replay.Loaded:
    return replay.load(d, store.fold_of(rec))


def _fold_all_segments(d: Path, rec: store.RunRecord) -> tuple[bytes, bytes]:
    """Every segment from the first byte of the first (each base ignored by the fold)."""
    view = store.empty_view(rec)
    for seg in segments.sealed(d):
        for r in read_journal(Path(seg.path)):
            view.apply(r)
    for r in read_journal(d / segments.ACTIVE_NAME):
        view.apply(r)
    return view_bytes(view)


def _no_retention() -> JournalPolicy:
    return JournalPolicy(
        snapshot_records=1000,
        batch_rows=64,
        segment_mib=0.0625,
        full_resolution_h=1e4,
        full_resolution_mib=1e5,
    )


def test_sealed_segments_begin_with_the_fold_of_all_before_them(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    live, w = write_run(d, rec, run_records(6000, ranks=2), _no_retention())
    sealed = segments.sealed(d)
    assert w.stats.seals >= 2 and [s.seq for s in sealed] == list(range(len(sealed)))
    bases = [segments.base_of(Path(s.path)) for s in sealed]
    assert bases[0] is None and all(b is not None for b in bases[1:])  # the first segment has none
    active = segments.base_of(d / segments.ACTIVE_NAME)
    assert active is not None and active.seq == len(sealed) and active.previous == bases[-1].segment  # type: ignore[union-attr]
    # The active segment stays near its size; a reader needs nothing behind it.
    assert (d / segments.ACTIVE_NAME).stat().st_size < 4 * SEGMENTED.segment_bytes
    loaded = _load(d, rec)
    assert view_bytes(loaded.view) == view_bytes(live) == _fold_all_segments(d, rec)
    # Without its snapshots, from the base: the same run.
    for name in (snapshot.SNAPSHOT_NAME, snapshot.PREVIOUS_NAME):
        (d / name).unlink()
    loaded = _load(d, rec)
    assert loaded.source == "base" and view_bytes(loaded.view) == view_bytes(live)


def test_a_damaged_base_without_snapshots_reads_from_the_sealed_segments(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    live, _w = write_run(d, rec, run_records(6000, ranks=2), _no_retention())
    for name in (snapshot.SNAPSHOT_NAME, snapshot.PREVIOUS_NAME):
        (d / name).unlink()
    active = d / segments.ACTIVE_NAME
    data = bytearray(active.read_bytes())
    data[20] ^= 0xFF  # inside the base record
    active.write_bytes(bytes(data))
    loaded = _load(d, rec)
    assert loaded.source == "start"
    st = loaded.view.state
    # Everything is there, and the damage is said, not hidden.
    assert st.journal_damage.regions == 1 and st.journal_damage.first_offset == 0
    assert st.steps_total == live.state.steps_total and st.attempts == live.state.attempts
    assert st.checkpoints == live.state.checkpoints


def test_retention_lets_old_steps_go_and_keeps_everything_else(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    policy = JournalPolicy(
        snapshot_records=1000,
        batch_rows=64,
        segment_mib=0.0625,
        full_resolution_h=1e4,
        full_resolution_mib=0.15,
    )
    live, w = write_run(d, rec, run_records(12000, ranks=2), policy)
    sealed = segments.sealed(d)
    lean = [s for s in sealed if s.lean]
    full = [s for s in sealed if not s.lean]
    assert w.stats.stripped == len(lean) >= 2
    # The newest full ones fit the allowance (the one that crossed it went lean too).
    assert sum(s.size for s in full) <= policy.full_resolution_bytes
    assert all(a.seq < b.seq for a in lean for b in full)
    for s in lean:
        recs = [r for _o, _e, r in read_frames(Path(s.path))]
        assert not [r for r in recs if isinstance(r, (p.StepBatch, p.Received)) and _is_step(r)]
        note = recs[-1]
        assert isinstance(note, p.KeeperNote) and note.kind == "retention" and "let go" in note.message
        # What stays is the base (the fold, for a reader that must start here) and the other
        # records: a few KiB beside a base, where the steps took the segment's size.
        base_end = read_frames(Path(s.path)).__next__()[1] if isinstance(recs[0], p.JournalBase) else 0
        assert s.size - base_end < 16 << 10
    # What a reader sees did not change: the fold of the steps lives in every later base.
    assert view_bytes(_load(d, rec).view) == view_bytes(live)
    kept = {
        r.path for s in lean for _o, _e, r in read_frames(Path(s.path)) if isinstance(r, p.CheckpointState)
    }
    assert kept and kept <= {c.path for c in live.state.checkpoints}
    # Bounded: what is on disk no longer grows with the steps let go.
    total = segments.journal_bytes(d)
    bases = sum(s.size for s in lean)
    assert total < policy.full_resolution_bytes + 3 * policy.segment_bytes + bases


def _is_step(r: p.Record) -> bool:
    return isinstance(r, p.StepBatch) or (
        isinstance(r, p.Received) and isinstance(r.msg, (p.Step, p.Heartbeat))
    )


def test_retention_by_age(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    _live, w = write_run(d, rec, run_records(6000, ranks=2), _no_retention())
    sealed = segments.sealed(d)
    old = sealed[0]
    week = time.time() - 7 * 86400
    os.utime(old.path, (week, week))
    due = segments.due_for_stripping(segments.sealed(d), time.time(), 72 * 3600.0, 1 << 40)
    assert [s.seq for s in due] == [old.seq]
    segments.strip(d, due[0])
    (lean,) = [s for s in segments.sealed(d) if s.lean]
    assert lean.seq == old.seq and abs(lean.mtime - week) < 1  # its age stays its records' age
    assert not segments.due_for_stripping(segments.sealed(d), time.time(), 72 * 3600.0, 1 << 40)
    assert w.stats.error is None


def test_a_seal_cut_short_by_a_crash_is_undone_on_reopening(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    records = list(run_records(1500, ranks=2))
    _live, w = write_run(d, rec, records, _no_retention(), close=False)
    w.flush(fsync=True)
    active = d / segments.ACTIVE_NAME
    before = active.read_bytes()
    # The keeper died after linking the sealed name and writing the next segment, before the
    # rename that puts it in place.
    (d / segments.NEXT_NAME).write_bytes(b"half a base")
    os.link(active, d / segments.sealed_name(w.seq))
    w2 = JournalWriter(d, store.fold_of(rec), _no_retention())
    assert not (d / segments.NEXT_NAME).exists()
    assert not (d / segments.sealed_name(w.seq)).exists()
    assert active.read_bytes()[: len(before)] == before
    assert view_bytes(w2.view) == view_bytes(_load(d, rec).view)
    w2.close()


def test_a_strip_cut_short_keeps_the_full_segment(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    write_run(d, rec, run_records(6000, ranks=2), _no_retention())
    seg = segments.sealed(d)[0]
    lean = d / segments.sealed_name(seg.seq, lean=True)
    lean.write_bytes(b"")  # renamed in place, the full one not yet unlinked (or half written)
    Path(str(lean) + ".tmp").write_bytes(b"partial")
    assert segments.sealed(d)[0].path == seg.path  # the full one is what counts
    segments.recover(d)
    assert not lean.exists() and not Path(str(lean) + ".tmp").exists() and Path(seg.path).exists()


def test_the_journal_section_of_trainroom_toml() -> None:
    cfg = decode_config(
        "[journal]\nbatch_s = 0.5\nsnapshot_records = 5000\nsegment_mib = 16\nfull_resolution_h = 24\n"
        "full_resolution_mib = 512\n"
    )
    j = cfg.journal
    assert (j.batch_s, j.snapshot_records, j.segment_bytes, j.full_resolution_h) == (
        0.5,
        5000,
        16 << 20,
        24.0,
    )
    assert j.full_resolution_bytes == 512 << 20
    for bad, says in (
        ("snapshot_records = 10", "journal.snapshot_records"),
        ("batch_s = nan", "journal.batch_s"),
        ("segment_mib = 0", "journal.segment_mib"),
        ("full_resolution_h = -1", "journal.full_resolution_h"),
        ("keep_forever = true", "journal.keep_forever: unknown key"),
    ):
        try:
            decode_config(f"[journal]\n{bad}\n", "trainroom.toml")
        except Exception as exc:  # ConfigError: one line naming the key and the file
            assert says in str(exc) and "trainroom.toml" in str(exc), str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_usage_counts_every_file_and_the_write_rate(tmp_path: Path) -> None:
    d, rec = make_run_dir(tmp_path)
    now = 0.0
    w = JournalWriter(d, store.fold_of(rec), _no_retention(), clock=lambda: now)
    assert w.usage().bytes_per_h is None  # nothing seen yet: no rate invented
    for i, r in enumerate(run_records(6000, ranks=2)):
        w.append(r)
        if i % 20 == 0:
            now += 1.0  # a record every 50 ms of the run's time
            w.flush()
    u = w.usage()
    files = [f for f in d.iterdir() if f.name.startswith(("journal.", "snapshot.", "summary."))]
    assert u.bytes == sum(f.stat().st_size for f in files) and u.segments == len(segments.sealed(d)) >= 1
    written = sum(s.size for s in segments.sealed(d)) + (d / segments.ACTIVE_NAME).stat().st_size
    # A segment holds segment_mib of its own records beside its base (a base bigger than a
    # segment must not make every flush seal).
    assert u.segments <= written // SEGMENTED.segment_bytes
    assert u.bytes_per_h is not None
    assert 0.5 * written / now * 3600 < u.bytes_per_h < 1.5 * written / now * 3600
    w.close()
