"""The run as a reader holds it: the state fold and the plot-series fold, fed the same records.

The keeper, every client (from its snapshot, then live deltas) and a replay of the journal all
build one, so nothing a client shows can disagree with the journal: the state through
`RunState.apply`, the loss/LR plot through `Series.observe_record`.
"""

from __future__ import annotations

import msgspec

from trainroom.core.run.series import Series, SeriesSnapshot
from trainroom.core.run.state import RunState, from_snapshot
from trainroom.core.wire import protocol as p


class RunView:
    def __init__(self, state: RunState, series: Series | None = None) -> None:
        self.state = state
        self.series = series if series is not None else Series()

    def apply(self, rec: p.Record) -> None:
        self.state.apply(rec)
        self.series.observe_record(rec)

    @classmethod
    def from_snapshot(cls, snap: p.Snapshot) -> RunView:
        series = None
        if snap.series is not None:
            series = Series.from_snapshot(msgspec.convert(snap.series, SeriesSnapshot))
        return cls(from_snapshot(snap.state), series)

    def to_snapshot(self) -> p.Snapshot:
        return p.Snapshot(
            v=p.PROTOCOL_VERSION,
            state=msgspec.to_builtins(self.state),
            series=msgspec.to_builtins(self.series.snapshot()),
        )
