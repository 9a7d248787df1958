"""What the journal folds its records into, as the engine sees it.

The engine stores records, snapshots and segment bases as bytes and replays them; what a record
means is the read model's business (`run.fold` gives the run's). A `Fold` is that read model
handed to the engine: a new empty view, how one record applies to a view, a view to bytes and
back, and the one-line summary a finished fold leaves beside the journal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

V = TypeVar("V")


class Fold(Protocol[V]):
    # Files beside the journal that the fold writes (counted in the journal's bytes on disk).
    side_files: tuple[str, ...]

    def new(self) -> V:
        """The empty view a fold from the very start begins with."""
        ...

    def applier(self, view: V, series: bool) -> Callable[[Any], None]:
        """What folds one record into `view` (without the plot series when `series` is False)."""
        ...

    def encode(self, view: V) -> bytes: ...

    def decode(self, data: bytes) -> V:
        """The view `encode` made; raises `snapshot.SnapshotError` on bytes that do not decode."""
        ...

    def summarize(self, run_dir: Path, journal: Path, view: V) -> None:
        """Write the fold's summary beside the journal `journal` (raises OSError)."""
        ...
