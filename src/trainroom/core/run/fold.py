"""The run's read model as the journal engine folds it (`journal.fold.Fold`): a `RunView` from the
run record, each record applied through `RunView.apply` (or the state alone), the view's bytes in
snapshots and segment bases, and the summary written beside the journal."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.journal.snapshot import SnapshotError
from trainroom.core.run import summary
from trainroom.core.run.series import Series, SeriesState
from trainroom.core.run.state import RunState
from trainroom.core.run.view import RunView


class _ViewState(msgspec.Struct, array_like=True):
    state: RunState
    series: SeriesState


_view_encoder = msgspec.msgpack.Encoder()
_view_decoder = msgspec.msgpack.Decoder(_ViewState)


def encode_view(view: RunView) -> bytes:
    body = _view_encoder.encode(_ViewState(state=view.state, series=view.series.state()))
    return zlib.compress(body, 1)


def decode_view(data: bytes) -> RunView:
    try:
        vs = _view_decoder.decode(zlib.decompress(data))
        return RunView(vs.state, Series.from_state(vs.series))
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise SnapshotError(f"view does not decode: {exc}") from None


class RunFold:
    """`new` makes the empty view a fold from the very start begins with (the run record's)."""

    side_files: tuple[str, ...] = (summary.SUMMARY_NAME,)

    def __init__(self, new: Callable[[], RunView]) -> None:
        self._new = new

    def new(self) -> RunView:
        return self._new()

    def applier(self, view: RunView, series: bool) -> Callable[[Any], None]:
        return view.apply if series else view.state.apply

    def encode(self, view: RunView) -> bytes:
        return encode_view(view)

    def decode(self, data: bytes) -> RunView:
        return decode_view(data)

    def summarize(self, run_dir: Path, journal: Path, view: RunView) -> None:
        s = summary.summarize(view.state, updated=time.time(), journal=summary.journal_mark(journal))
        summary.write(run_dir, s)
