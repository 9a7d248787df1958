"""Runs that end cost nothing: the keeper of an ended run rests (no probe cycles) and exits after
its linger unless a client is connected; `stop-keeper` ends one at once and refuses while a
trainer runs; "live" is a trainer that runs. Every test drives real keeper processes."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

from tests.support.helpers import run_cli
from tests.support.waiting import wait_for
from trainroom.core import protocol as p
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.run.live import trainer_runs
from trainroom.core.settings import LaunchOptions

# Steps until a file appears, then exits 0.
UNTIL_TOLD = """
    import os, sys, time
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    step = 0
    while not os.path.exists(sys.argv[1]):
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        time.sleep(0.05)
"""


def _launch(tmp_path: Path, name: str, linger_s: float) -> tuple[runs.RunInfo, Path]:
    script = tmp_path / "until_told.py"
    script.write_text(textwrap.dedent(UNTIL_TOLD))
    stop = tmp_path / f"stop-{name}"
    info = launch(
        [sys.executable, str(script), str(stop)], LaunchOptions(linger_s=linger_s), cwd=str(tmp_path)
    )
    return info, stop


def _notes(info: runs.RunInfo) -> list[p.KeeperNote]:
    recs = read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
    return [r for r in recs if isinstance(r, p.KeeperNote)]


def _rested(info: runs.RunInfo) -> p.KeeperNote | None:
    return next((n for n in _notes(info) if "the keeper rests" in n.message), None)


def _keeper_alive(info: runs.RunInfo) -> bool:
    return runs.keeper_alive(runs.read_record(Path(info.run_dir)))


def test_an_ended_runs_keeper_rests_then_exits_after_its_linger(trhome: Path, tmp_path: Path) -> None:
    info, stop = _launch(tmp_path, "a", linger_s=2.0)
    wait_for(lambda: _keeper_alive(info), timeout=30, what="the keeper")
    assert _rested(info) is None  # a training run is watched, not rested
    stop.touch()
    wait_for(lambda: _rested(info), timeout=60, what="the keeper to rest")
    # Reading the run (`status` connects to its keeper, well within each linger) is no viewer:
    # it does not restart the linger, so these reads do not keep the keeper.
    wait_for(
        lambda: run_cli("status", info.run_id).returncode == 0 and not _keeper_alive(info),
        timeout=60,
        what="the keeper to exit after its linger while `status` reads it",
    )
    notes = [n.message for n in _notes(info)]
    assert any("keeper exits after 2 s idle" in m for m in notes), notes
    assert "once 2 s pass with no viewer attached" in (_rested(info) or p.KeeperNote(t=0, message="")).message


def test_a_connected_viewer_keeps_a_resting_keeper_until_it_leaves(trhome: Path, tmp_path: Path) -> None:
    info, stop = _launch(tmp_path, "b", linger_s=1.0)
    viewer = KeeperClient(info.sock)
    viewer.subscribe(client="test-viewer", live=True)
    try:
        stop.touch()
        rested = wait_for(lambda: _rested(info), timeout=60, what="the keeper to rest")
        # The property under test is outliving the linger: wait on the clock past three lingers
        # after the rest began, then the keeper must still be there for its viewer.
        wait_for(lambda: time.time() > rested.t + 3.0, timeout=30, what="three lingers")
        assert _keeper_alive(info)
        assert not any("keeper exits" in n.message for n in _notes(info))
    finally:
        viewer.close()
    wait_for(lambda: not _keeper_alive(info), timeout=60, what="the keeper to exit once its viewer left")
    assert any("keeper exits after 1 s idle" in n.message for n in _notes(info))


def test_stop_keeper_ends_lingering_keepers_and_refuses_while_a_trainer_runs(
    trhome: Path, tmp_path: Path
) -> None:
    ended, ended_stop = _launch(tmp_path, "ended", linger_s=600.0)
    training, training_stop = _launch(tmp_path, "training", linger_s=600.0)
    ended_stop.touch()
    wait_for(lambda: _rested(ended), timeout=60, what="the ended run's keeper to rest")

    # "live" is a trainer that runs: the lingering keeper's run is not, for `runs` and the picker.
    by_id = {r.run_id: r for r in runs.list_runs()}
    assert by_id[ended.run_id].alive and not trainer_runs(by_id[ended.run_id])
    assert trainer_runs(by_id[training.run_id])
    rows = {r["run"]: r for r in json.loads(run_cli("runs", "--json").stdout)}
    assert rows[ended.run_id]["alive"] and not rows[ended.run_id]["training"]
    assert rows[training.run_id]["training"]

    refused = run_cli("stop-keeper", training.run_id)
    assert refused.returncode == 1 and "refused: its trainer runs" in refused.stdout, refused
    assert _keeper_alive(training)

    swept = run_cli("stop-keeper", "--ended")
    assert swept.returncode == 0, swept
    assert f"{ended.run_id}: keeper pid" in swept.stdout and "exited" in swept.stdout
    assert training.run_id not in swept.stdout
    assert not _keeper_alive(ended) and _keeper_alive(training)

    training_stop.touch()
    wait_for(lambda: _rested(training), timeout=60, what="the second keeper to rest")
    done = run_cli("stop-keeper", training.run_id)
    assert done.returncode == 0 and "exited" in done.stdout, done
    assert not _keeper_alive(training)
    again = run_cli("stop-keeper", training.run_id)
    assert again.returncode == 0 and "no keeper running" in again.stdout
