"""How the control room reaches a run: its keeper while it lives, its journal when it is gone.

No Textual here. `KeeperLink` is the boundary the app talks through (the lead's
`core.run.client.KeeperClient` fits it); `RunSource` finds runs and opens links. Tests hand the app a
`RunSource` whose links are fakes; everything above that boundary is the real app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from trainroom.core.protocol import Record, Reply
from trainroom.core.run import store as runs
from trainroom.core.run import summary
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.core.run.view import RunView


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

    def summary(self, run: RunInfo) -> RunSummary | None:
        """The run's one-line summary as its keeper last wrote it (None without one)."""
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

    def summary(self, run: RunInfo) -> RunSummary | None:
        """summary.msgpack, a few seconds old at most for a live run: no journal read."""
        return summary.read(Path(run.run_dir))
