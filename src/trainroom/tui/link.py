"""How the control room reaches a run: its keeper while it lives, its journal when it is gone.

No Textual here. `KeeperLink` is the boundary the app talks through
(`core.run.client.KeeperClient` fits it); `RunSource` finds runs and opens links. Tests hand the app a
`RunSource` whose links are fakes; everything above that boundary is the real app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from trainroom.core.run import store as runs
from trainroom.core.run import summary
from trainroom.core.run.client import KeeperClient, snapshot
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.core.run.view import RunView
from trainroom.core.wire.protocol import Record, Reply

from .overview import RunRow, by_job, row_of, row_of_summary, unreadable


class KeeperLink(Protocol):
    """A keeper's socket, as a blocking client."""

    def subscribe_view(self, client: str = "tui") -> RunView:
        """Connect and return the snapshot (state and plot series); `records()` then yields the
        live deltas."""
        ...

    def records(self) -> Iterator[list[Record]]:
        """Batches of keeper records until the keeper goes away (then it raises or ends)."""
        ...

    def request(self, action: str, args: dict[str, object], confirm: bool) -> Iterator[Reply]:
        """An action on its own connection: plan, progress lines, done."""
        ...

    def close(self) -> None:
        """Unblock `records()` and release the socket."""
        ...


class RunSource(Protocol):
    """Where runs are found and how each is reached."""

    def list_runs(self) -> list[RunInfo]: ...

    def resolve(self, spec: str | None) -> RunInfo: ...

    def connect(self, run: RunInfo) -> KeeperLink: ...

    def load_view(self, run: RunInfo) -> RunView: ...

    def peek(self, run: RunInfo) -> RunState:
        """A live run's state once, from its keeper (no live deltas)."""
        ...

    def summary(self, run: RunInfo) -> RunSummary | None:
        """A finished run's one-line summary as its keeper last wrote it, while it still matches
        the journal (None: read the journal instead)."""
        ...


class LocalRuns:
    """Runs under this machine's state dir (`TRAINROOM_HOME`), reached over their sockets."""

    def list_runs(self) -> list[RunInfo]:
        return runs.list_runs()

    def resolve(self, spec: str | None) -> RunInfo:
        return runs.resolve_run(spec)

    def connect(self, run: RunInfo) -> KeeperLink:
        return KeeperClient(run.sock)

    def load_view(self, run: RunInfo) -> RunView:
        """The newest snapshot and the journal after it, into the state and its plot series."""
        return runs.load_view(run.run_dir)

    def peek(self, run: RunInfo) -> RunState:
        return snapshot(run.sock, timeout_s=2.0)

    def summary(self, run: RunInfo) -> RunSummary | None:
        """summary.msgpack, trusted with one stat of the journal (run.summary.fresh)."""
        d = Path(run.run_dir)
        s = summary.read(d)
        return s if s is not None and summary.fresh(s, d / runs.JOURNAL_NAME) else None


class OverviewReader:
    """The runs overview's rows for a `RunSource`: a live run from its keeper's snapshot, a
    finished one from its journal once (kept while the journal's size and mtime stay: a finished
    run's journal no longer grows, so it is not read again every refresh)."""

    def __init__(self, source: RunSource) -> None:
        self.source = source
        self._done: dict[str, tuple[tuple[int, int], RunRow]] = {}

    def rows(self, current: RunRow | None = None) -> list[RunRow]:
        """Every run; `current` is the row of the one the control room already follows, taken as
        it is (no second connection to its keeper)."""
        out = []
        for info in self.source.list_runs():
            try:
                if current is not None and info.run_id == current.run_id:
                    out.append(current)
                elif info.alive:
                    out.append(self._live(info))
                else:
                    out.append(self._finished(info))
            except Exception as exc:  # one unreadable run is a row that says so, not no overview
                out.append(unreadable(info, str(exc) or type(exc).__name__))
        return by_job(out)

    def _live(self, info: RunInfo) -> RunRow:
        return row_of(info, self.source.peek(info), True)

    def _finished(self, info: RunInfo) -> RunRow:
        mark = _journal_mark(Path(info.run_dir))
        cached = self._done.get(info.run_id)
        if cached is not None and cached[0] == mark:
            return cached[1]
        s = self.source.summary(info)
        row = (
            row_of_summary(info, s)
            if s is not None
            else row_of(info, self.source.load_view(info).state, False)
        )
        self._done[info.run_id] = (mark, row)
        return row


def _journal_mark(run_dir: Path) -> tuple[int, int]:
    try:
        st = (run_dir / runs.JOURNAL_NAME).stat()
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)
