"""The batches behind a loss spike: each step a trainer reports may name its batch (`BatchRef`:
epoch and index, sampler seed, sample ids, a tag). The keeper keeps the last WINDOW of them per rank
in memory (the journal's compressed step columns do not carry them) and, when a finding that may be
the data's doing opens (LOSS_SPIKE, DIVERGENCE, NONFINITE), journals that rank's window once as a
`BatchLog`: the steps before it and the one it names, with their losses, so `trainroom replay` can
hand the trainer the same batch again, from the checkpoint before it."""

from __future__ import annotations

import time
from collections import deque

from trainroom.core.findings import Finding
from trainroom.core.wire import protocol as p

WINDOW = 64
REPLAY_CODES = frozenset({"LOSS_SPIKE", "DIVERGENCE", "NONFINITE"})


class BatchWindow:
    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.rows: dict[tuple[int, int], deque[p.BatchRow]] = {}  # (attempt, rank) -> recent rows
        self.logged: set[str] = set()  # finding idents whose window was journaled

    def observe(self, rec: p.Record) -> None:
        if not (isinstance(rec, p.Received) and isinstance(rec.msg, p.Step) and rec.msg.batch is not None):
            return
        key = (rec.attempt, rec.rank)
        ring = self.rows.get(key)
        if ring is None:
            # One attempt at a time: an earlier attempt's window is no longer what a finding names.
            self.rows = {k: v for k, v in self.rows.items() if k[0] == rec.attempt}
            ring = self.rows[key] = deque(maxlen=self.window)
        ring.append(p.BatchRow(rec.msg.step, rec.msg.loss, rec.msg.batch))

    def raised(self, f: Finding, attempt: int) -> p.BatchLog | None:
        """The window to journal for a finding that just opened (None: not one of REPLAY_CODES, no
        batches reported, or its window was journaled already)."""
        if f.code not in REPLAY_CODES or f.ident in self.logged:
            return None
        rank = f.evidence.get("rank", 0)
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else 0
        ring = self.rows.get((attempt, rank))
        if not ring:
            return None
        self.logged.add(f.ident)
        return p.BatchLog(
            t=time.time(), code=f.code, ident=f.ident, attempt=attempt, rank=rank, rows=list(ring)
        )
