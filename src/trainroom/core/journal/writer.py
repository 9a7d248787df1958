"""The keeper's side of the journal: compact step batches, snapshots, segments and retention.

The keeper hands every record it journals to `JournalWriter.append`, in order, and calls
`flush` each tick, as it did with the bare `Journal` (whose damage tolerance, pending backlog
and torn-tail repair all stay: this writes through it). What it adds:

- Steps and heartbeats wait (up to `batch_s`, or `batch_rows` steps) and go in as one
  `StepBatch`. Any other record first writes the batch out, so the journal keeps the order the
  records came in exactly (a finding stays after the steps that raised it; such records are few,
  so batches stay large).
- The writer folds exactly what it writes, in the order written (`view`), so a snapshot of that
  fold is what a reader replaying the journal up to the same offset would get. (The keeper's
  live view is another fold: it also takes records that are sent but never journaled, such as
  probe samples and the live figures of an open finding.)
- Every `snapshot_records` records, and at close, a snapshot; every few seconds while the run
  changes, the one-line summary; at `segment_mib`, a new segment; retention in a thread.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic

import msgspec

from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.journal import file as journal_mod
from trainroom.core.journal import replay, segments, snapshot, stepbatch
from trainroom.core.journal.file import BACKLOG_BYTES, MAX_RECORD, Journal, JournalHealth
from trainroom.core.journal.fold import Fold, V
from trainroom.core.wire import protocol as p

SUMMARY_S = 5.0  # at most one summary this often while the run changes
RETENTION_CHECK_S = 600.0  # how often sealed segments are looked at for retention
RATE_WINDOW_S = 3600.0
# Tests only: `PATH` or `PATH:N`: the Nth snapshot write (default the first) stops halfway,
# creates PATH and waits there (up to HOLD_S), so a test can kill the keeper in the middle of it.
ENV_SNAPSHOT_HOLD = "TRAINROOM_TEST_SNAPSHOT_HOLD"
HOLD_S = 60.0


def hold_from_env() -> Callable[[], None] | None:
    spec = os.environ.get(ENV_SNAPSHOT_HOLD)
    if not spec:
        return None
    path, _, nth = spec.rpartition(":") if spec.rpartition(":")[2].isdigit() else (spec, "", "1")
    calls = 0

    def hold() -> None:
        nonlocal calls
        calls += 1
        if calls == int(nth):
            Path(path).touch()
            time.sleep(HOLD_S)

    return hold


class JournalUsage(msgspec.Struct, kw_only=True, frozen=True):
    """What the run's journal takes on disk, and how fast the keeper writes to it."""

    path: str  # the run dir
    bytes: int  # every segment, snapshots and summary included
    segments: int  # sealed ones
    lean_segments: int  # sealed ones whose steps retention let go
    bytes_per_h: float | None  # written lately (None until a few minutes were seen)


class WriterStats(msgspec.Struct, kw_only=True):
    batches: int = 0
    batched_records: int = 0
    snapshots: int = 0
    snapshot_bytes: int = 0
    seals: int = 0
    stripped: int = 0
    error: str | None = None  # the last snapshot, seal or retention failure (the journal goes on)


class JournalWriter(Generic[V]):
    def __init__(
        self,
        run_dir: Path,
        fold: Fold[V],
        policy: JournalPolicy | None = None,
        *,
        backlog_bytes: int = BACKLOG_BYTES,
        hold: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` times the batches (a benchmark replaying a day in seconds passes the run's own
        clock); `hold` is the tests' seam in the middle of a snapshot (hold_from_env)."""
        self.run_dir = run_dir
        self._clock = clock
        self.policy = policy or JournalPolicy()
        self._fold = fold
        self._hold = hold
        self.stats = WriterStats()
        segments.recover(run_dir)
        active = run_dir / segments.ACTIVE_NAME
        base = segments.base_of(active)
        self.seq = base.seq if base is not None else 0
        self.segment = base.segment if base is not None else ""
        self.journal = Journal(active, backlog_bytes)
        # Where the segment's own records begin (after its base): what counts toward segment_mib,
        # so a fold bigger than a segment cannot make every flush seal.
        self._base_end = self._segment_start(base)
        # A keeper taking up a run that has a journal goes on from its fold.
        if self.journal.size or segments.sealed(run_dir):
            loaded = replay.load(run_dir, fold)
            self.view, self.records = loaded.view, loaded.records
        else:
            self.view, self.records = fold.new(), 0
        self._batch: list[p.Received] = []
        self._batch_steps = 0
        self._batch_attempt = 0
        self._batch_since = 0.0
        self._since_snapshot = 0
        self._dropped = self.journal.health.dropped_records
        self._exact = True
        self._changed = False
        self._summary_at = 0.0
        self._retention_at = 0.0
        self._retention: threading.Thread | None = None
        self._written = 0  # bytes written to the journal by this writer
        self._size = self.journal.size
        self._rate: deque[tuple[float, int]] = deque()
        self._rate_lock = threading.Lock()  # usage() reads it from the keeper's probe thread

    # ------------------------------------------------------------------ what the keeper used

    @property
    def health(self) -> JournalHealth:
        return self.journal.health

    @property
    def backlog_bytes(self) -> int:
        return self.journal.backlog_bytes

    @property
    def path(self) -> Path:
        return self.journal.path

    def append(self, rec: p.Record) -> None:
        if isinstance(rec, p.Received) and stepbatch.batchable(rec):
            if self._batch and rec.attempt != self._batch_attempt:
                self._flush_batch()
            if not self._batch:
                self._batch_attempt, self._batch_since = rec.attempt, self._clock()
            self._batch.append(rec)
            self._batch_steps += isinstance(rec.msg, p.Step)
            rows = self.policy.batch_rows
            if self._batch_steps >= rows or len(self._batch) >= 2 * rows:
                self._flush_batch()
            return
        self._flush_batch()
        self._store(rec, (rec,))

    def flush(self, fsync: bool = False) -> bool:
        """Write what is due; False when the write failed (the records stay pending). Snapshots,
        the summary, sealing and retention happen here, when nothing is pending."""
        now = self._clock()
        if self._batch and now - self._batch_since >= self.policy.batch_s:
            self._flush_batch()
        ok = self.journal.flush(fsync=fsync)
        self._count_written(now)
        if self.journal.health.dropped_records != self._dropped:
            # Records the fold took never reached the file: the fold is no longer the journal's.
            self._dropped = self.journal.health.dropped_records
            self._exact = False
        if ok and not self.journal.pending:
            self._maintain(now)
        return ok

    def close(self) -> None:
        """Write everything, a last snapshot and summary (a finished run then reads at once)."""
        self._flush_batch()
        try:
            if self.journal.flush(fsync=True) and not self.journal.pending:
                if not self._exact:
                    self._refold()
                self.snapshot()
        finally:
            self.journal.close()
            if self._retention is not None:
                self._retention.join(timeout=30)

    # ------------------------------------------------------------------ the fold of what is written

    def _store(self, stored: p.Record, logical: Sequence[p.Record]) -> None:
        self.journal.append(stored)
        apply = self._fold.applier(self.view, True)
        for r in logical:
            apply(r)
        self.records += len(logical)
        self._since_snapshot += len(logical)
        self._changed = True

    def _flush_batch(self) -> None:
        if not self._batch:
            return
        recs, attempt = self._batch, self._batch_attempt
        self._batch, self._batch_steps = [], 0
        try:
            batch = stepbatch.encode(attempt, recs)
        except (ValueError, OverflowError, TypeError):
            batch = None  # a value the columns cannot hold exactly: one record each
        if batch is None or len(batch.data) > MAX_RECORD // 2:
            for r in recs:
                self._store(r, (r,))
            return
        self._store(batch, recs)
        self.stats.batches += 1
        self.stats.batched_records += len(recs)

    def _segment_start(self, base: p.JournalBase | None) -> int:
        if base is None:
            return 0
        found = journal_mod.record_crc_at(self.journal.path, 0)
        return found[0] if found is not None else 0

    def _refold(self) -> None:
        loaded = replay.load(self.run_dir, self._fold)
        self.view, self.records = loaded.view, loaded.records
        self._exact = True

    # ------------------------------------------------------------------ snapshots, summary, segments

    def _maintain(self, now: float) -> None:
        if not self._exact:
            self._refold()
        if self.journal.size - self._base_end >= self.policy.segment_bytes:
            self.seal()
        elif self._since_snapshot >= self.policy.snapshot_records:
            self.snapshot()
        elif self._changed and now >= self._summary_at:
            self.write_summary()
        if now >= self._retention_at:
            self._retention_at = now + RETENTION_CHECK_S
            self._retain()

    def position(self) -> snapshot.Position:
        return snapshot.Position(
            segment=self.segment,
            seq=self.seq,
            offset=self.journal.size,
            last=self.journal.last_record,
            records=self.records,
        )

    def snapshot(self) -> bool:
        """A snapshot of the fold at the journal's end (fsynced first: a snapshot is never ahead
        of what the disk holds). False when it could not be written; the journal goes on."""
        if not self.journal.flush(fsync=True) or self.journal.pending:
            return False
        snap = snapshot.Snapshot(t=time.time(), position=self.position(), view=self._fold.encode(self.view))
        try:
            self.stats.snapshot_bytes = snapshot.write(self.run_dir, snap, self._hold)
        except OSError as exc:
            self.stats.error = f"snapshot: {exc.strerror or exc}"
            return False
        self.stats.snapshots += 1
        self._since_snapshot = 0
        self.write_summary()
        return True

    def write_summary(self) -> None:
        self._changed = False
        self._summary_at = self._clock() + SUMMARY_S
        try:
            self._fold.summarize(self.run_dir, self.journal.path, self.view)
        except OSError as exc:
            self.stats.error = f"summary: {exc.strerror or exc}"

    def seal(self) -> bool:
        """Start a new segment that begins with the fold of everything so far."""
        if not self.journal.flush(fsync=True) or self.journal.pending:
            return False
        view = self._fold.encode(self.view)
        if len(view) > MAX_RECORD // 2:
            self.stats.error = f"seal: the run's fold takes {len(view)} bytes; the segment goes on"
            return False
        base = p.JournalBase(
            seq=self.seq + 1,
            segment=secrets.token_hex(8),
            previous=self.segment,
            t=time.time(),
            records=self.records,
            view=view,
        )
        try:
            segments.seal(self.run_dir, self.seq, base)
        except OSError as exc:
            self.stats.error = f"seal: {exc.strerror or exc}"
            (self.run_dir / segments.NEXT_NAME).unlink(missing_ok=True)
            return False
        old = self.journal
        old.close()
        self.journal = Journal(old.path, old.backlog_bytes)
        self.journal.health = msgspec.structs.replace(old.health)
        self._size = self._base_end = self.journal.size
        self.seq, self.segment = base.seq, base.segment
        self._since_snapshot = 0
        self.stats.seals += 1
        self._retain()
        self.write_summary()
        return True

    def _retain(self) -> None:
        if self._retention is not None and self._retention.is_alive():
            return
        due = segments.due_for_stripping(
            segments.sealed(self.run_dir),
            time.time(),
            self.policy.full_resolution_h * 3600.0,
            self.policy.full_resolution_bytes,
        )
        if due:
            self._retention = threading.Thread(target=self._strip, args=(due,), name="retention", daemon=True)
            self._retention.start()

    def _strip(self, due: list[segments.Segment]) -> None:
        for seg in due:
            try:
                segments.strip(self.run_dir, seg)
                self.stats.stripped += 1
            except OSError as exc:
                self.stats.error = f"retention: {exc.strerror or exc}"
                return

    # ------------------------------------------------------------------ disk

    def _count_written(self, now: float) -> None:
        size = self.journal.size
        if size > self._size:
            self._written += size - self._size
        self._size = size
        if not self._rate or now - self._rate[-1][0] >= 30.0:
            with self._rate_lock:
                self._rate.append((now, self._written))
                while len(self._rate) > 2 and now - self._rate[1][0] >= RATE_WINDOW_S:
                    self._rate.popleft()

    def usage(self) -> JournalUsage:
        """The journal's bytes on disk and its write rate (any thread: reads files and a deque)."""
        sealed = segments.sealed(self.run_dir)
        total = segments.journal_bytes(self.run_dir)
        for name in (snapshot.SNAPSHOT_NAME, snapshot.PREVIOUS_NAME, *self._fold.side_files):
            try:
                total += (self.run_dir / name).stat().st_size
            except OSError:
                pass
        rate = None
        with self._rate_lock:
            samples = list(self._rate)
        if len(samples) >= 2 and samples[-1][0] - samples[0][0] >= 120.0:
            (t0, b0), (t1, b1) = samples[0], samples[-1]
            rate = (b1 - b0) / (t1 - t0) * 3600.0
        return JournalUsage(
            path=str(self.run_dir),
            bytes=total,
            segments=len(sealed),
            lean_segments=sum(1 for s in sealed if s.lean),
            bytes_per_h=rate,
        )
