"""A cap on dead runs' lingering keepers: with `[keeper] max_dead_lingerers = 2`, three runs whose
trainers died keep two keepers; the one lingering longest leaves first, saying why in its journal."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.waiting import process_ended, wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.keeper.lingering import MARKER
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

START_S = 120


def _notes(info: runs.RunInfo) -> list[str]:
    return [
        r.message for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.KeeperNote)
    ]


def test_the_oldest_dead_lingerer_leaves_first_past_the_cap(trhome: Path, tmp_path: Path) -> None:
    (trhome / "trainroom.toml").write_text("[keeper]\ndead_linger_s = 900\nmax_dead_lingerers = 2\n")
    dies = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(1)"]
    started: list[runs.RunInfo] = []
    for _ in range(3):
        info = launch(dies, {}, cwd=str(tmp_path))
        started.append(info)
        # Each lingers dead (idle, its marker down) before the next starts: a known order.
        wait_for(lambda i=info: (Path(i.run_dir) / MARKER).exists(), timeout=START_S, what="a dead lingerer")
    first, second, third = started

    def gone(i: runs.RunInfo) -> bool:
        return not runs.resolve_run(i.run_id).alive

    wait_for(lambda: gone(first), timeout=START_S, what="the oldest dead lingerer to leave")
    # Its socket goes first; its exit note is journaled before its process ends.
    keeper = runs.read_record(Path(first.run_dir)).keeper_pid
    assert keeper is not None
    wait_for(lambda: process_ended(keeper), timeout=START_S, what="the oldest lingerer's process ended")
    said = [m for m in _notes(first) if "max_dead_lingerers = 2" in m]
    assert said and said[0].startswith("keeper exits: 3 dead runs' keepers linger"), _notes(first)
    assert not (Path(first.run_dir) / MARKER).exists()
    assert not gone(second) and not gone(third)
