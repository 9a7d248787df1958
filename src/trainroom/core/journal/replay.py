"""Reading a run back from its journal, in a time that does not grow with the run.

The newest snapshot that verifies (see `journal.snapshot`), then the active segment's records after
its offset. Without one, the active segment's base, then its records. Without a base that
decodes either (damage), the newest sealed segment that has one (or the first segment), then
every segment after it: slower, and as complete as the sealed segments still are, but never
blind. Whichever way, the records folded are the journal's: a snapshot is a shortcut, never a
second truth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, Literal, NamedTuple

from trainroom.core.journal import file as journal
from trainroom.core.journal import segments, snapshot
from trainroom.core.journal.fold import Fold, V

Source = Literal["snapshot", "base", "start"]


class Loaded(NamedTuple, Generic[V]):
    view: V
    source: Source  # where the fold began
    records: int  # records folded in all (those inside the snapshot or base included)
    tail_records: int  # records read from the journal to get here


def _fold(fold: Fold[V], view: V, path: Path, start: int, series: bool) -> int:
    apply = fold.applier(view, series)
    n = 0
    for rec in journal.read_journal(path, start):
        apply(rec)
        n += 1
    return n


def _base_end(path: Path) -> int:
    found = journal.record_crc_at(path, 0)
    return found[0] if found is not None else 0


def _from_the_start(run_dir: Path, active: Path, fold: Fold[V]) -> tuple[V, int, list[tuple[Path, int]]]:
    """Where a fold without a usable snapshot or active base begins: (view, records in it, the
    (segment, offset) pairs to fold from there on)."""
    older = [s for s in segments.sealed(run_dir) if not segments.same_file(Path(s.path), active)]
    for i in range(len(older) - 1, -1, -1):
        path = Path(older[i].path)
        rest = [(Path(s.path), 0) for s in older[i + 1 :]] + [(active, 0)]
        if older[i].seq == 0:
            return fold.new(), 0, [(path, 0), *rest]
        base = segments.base_of(path)
        if base is None:
            continue
        try:
            view = fold.decode(base.view)
        except snapshot.SnapshotError:
            continue
        return view, base.records, [(path, _base_end(path)), *rest]
    return fold.new(), 0, [(Path(s.path), 0) for s in older] + [(active, 0)]


def load(run_dir: Path, fold: Fold[V], *, series: bool = True) -> Loaded[V]:
    """The run's view as its journal says, folded by `fold` (its `new` is the empty view a fold
    from the very start begins with: the run record's)."""
    active = run_dir / segments.ACTIVE_NAME
    base = segments.base_of(active)
    segment = base.segment if base is not None else ""
    base_end = _base_end(active) if base is not None else 0
    for snap in snapshot.candidates(run_dir):
        if not snapshot.fits(snap.position, active, segment, base_end):
            continue
        try:
            view = fold.decode(snap.view)
        except snapshot.SnapshotError:
            continue
        n = _fold(fold, view, active, snap.position.offset, series)
        return Loaded(view, "snapshot", snap.position.records + n, n)
    if base is not None:
        try:
            view = fold.decode(base.view)
        except snapshot.SnapshotError:
            pass
        else:
            n = _fold(fold, view, active, base_end, series)
            return Loaded(view, "base", base.records + n, n)
    view, before, chain = _from_the_start(run_dir, active, fold)
    n = sum(_fold(fold, view, path, start, series) for path, start in chain)
    return Loaded(view, "start", before + n, n)
