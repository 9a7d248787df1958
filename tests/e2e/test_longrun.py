"""Runs that last weeks, in miniature: a real keeper, a fast SDK trainer on two ranks, small
segments and frequent snapshots (trainroom.toml [journal]). What the journal says once the
keeper is gone is what the keeper said live; a keeper killed with -9 in the middle of a
snapshot leaves a run that reads."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.helpers import run_cli
from tests.support.waiting import process_ended, wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal import replay, segments, snapshot
from trainroom.core.journal.file import read_journal
from trainroom.core.journal.writer import ENV_SNAPSHOT_HOLD
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.run.status import status_dict
from trainroom.core.wire import protocol as p

# Rank 0 starts rank 1 beside it; each steps as fast as it can (a float32 loss, tokens, two LR
# groups, a decay), then exits 0; with STEPS=0 they step until killed.
TRAINER = """
    import math, os, struct, subprocess, sys, time
    from trainroom.core import sdk
    steps = int(sys.argv[1])
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        child = subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, "RANK": "1", "WORLD_SIZE": "2"})
    rep = sdk.connect(lr=3e-4, vocab_size=50257, rank=rank, world_size=2)
    step, lr = 0, 3e-4
    while steps == 0 or step < steps:
        step += 1
        if step % 1500 == 0:
            lr /= 3
        loss = struct.unpack("f", struct.pack("f", 9 * math.exp(-step / 900) + 2 + 0.01 * (step % 7)))[0]
        rep.step(step, loss=loss, tokens=step * 4096, grad_norm=1.0 + (step % 5) / 10, lr=[lr, lr / 10])
        time.sleep(0.002)
    rep.close()
    if rank == 0:
        sys.exit(child.wait())
"""

TOML = """
[journal]
batch_s = 0.2
snapshot_records = 1000
segment_mib = {segment_mib}
full_resolution_mib = 1000
"""


def _launch(
    tmp_path: Path, steps: int, segment_mib: float = 0.0625, env: dict[str, str] | None = None
) -> runs.RunInfo:
    (tmp_path / "trainroom.toml").write_text(TOML.format(segment_mib=segment_mib))
    script = tmp_path / "fast_trainer.py"
    script.write_text(textwrap.dedent(TRAINER))
    opts = LaunchOptions(linger_s=600)
    return launch([sys.executable, str(script), str(steps)], opts, cwd=str(tmp_path), env=env)


def _live(info: runs.RunInfo) -> tuple[dict[str, Any], Any]:
    c = KeeperClient(info.sock)
    try:
        view = c.subscribe_view(client="test", live=False)
    finally:
        c.close()
    return status_dict(view.state, keeper_alive=True), view.series.snapshot()


# What the journal holds (probe readings and the live figures of a finding are sent, never
# journaled; times move on): every other key of `status --json` must agree.
NOT_JOURNALED = {
    "keeper",
    "step_age_s",
    "ended_s_ago",
    "vram",
    "gpu",  # the driver's devices and the kernel log's source, from the live probe like vram
    "host",
    "disk",
    "latest_checkpoint",
    "journal",
}


def _comparable(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in d.items() if k not in NOT_JOURNALED}
    out["findings"] = [(f["code"], f["severity"], f["action"]) for f in d["findings"]]
    return json.loads(json.dumps(out, default=str))  # type: ignore[no-any-return]


def _full_replay(run_dir: Path) -> tuple[bytes, bytes]:
    """Every segment from the first byte of the first: what no snapshot or base shortcut sees."""
    view = runs.empty_view(runs.read_record(run_dir))
    for seg in segments.sealed(run_dir):
        assert not seg.lean
        for r in read_journal(Path(seg.path)):
            view.apply(r)
    for r in read_journal(run_dir / runs.JOURNAL_NAME):
        view.apply(r)
    return msgspec.msgpack.encode(view.state), msgspec.msgpack.encode(view.series.state())


def test_status_from_the_journal_after_the_keeper_is_gone_equals_the_live_one(
    trhome: Path, tmp_path: Path
) -> None:
    # Enough steps that the journal passes one 64 KiB segment whatever the pace: a fast, unloaded
    # run packs its steps into fewer, better-compressed batches (4000 stayed under it at times).
    steps = 10000
    info = _launch(tmp_path, steps)
    wait_for(
        lambda: _live(info)[0]["state"] == "exited", timeout=240, what=f"both ranks through {steps} steps"
    )
    live, live_series = _live(info)
    assert live["steps_total"] == 2 * steps and live["exit"]["code"] == 0
    rec = runs.read_record(Path(info.run_dir))
    assert rec.keeper_pid is not None
    os.kill(rec.keeper_pid, signal.SIGTERM)  # a clean exit: the last snapshot is written
    wait_for(lambda: not runs.resolve_run(info.run_id).alive, timeout=60, what="keeper gone")
    # Its socket goes first; the last snapshot is written before the process ends.
    wait_for(lambda: process_ended(rec.keeper_pid), timeout=60, what="the keeper's process ended")

    out = run_cli("status", info.run_id, "--json")
    assert out.returncode == 0, out.stderr
    from_journal = json.loads(out.stdout)
    assert from_journal["keeper"] == "gone"
    assert _comparable(from_journal) == _comparable(live)
    d = Path(info.run_dir)
    loaded = replay.load(d, runs.fold_of(rec))
    assert loaded.source == "snapshot" and loaded.tail_records == 0  # the exit's snapshot: nothing to replay
    assert loaded.view.series.snapshot() == live_series  # the loss plot, bucket for bucket
    sealed = segments.sealed(d)
    assert sealed, "a 64 KiB segment should have been sealed along the way"
    assert (
        msgspec.msgpack.encode(loaded.view.state),
        msgspec.msgpack.encode(loaded.view.series.state()),
    ) == (_full_replay(d))
    # Each step once, in order, on each rank, batches expanded back.
    rows = [
        (r.rank, r.msg.step)
        for seg in [*(Path(s.path) for s in sealed), d / runs.JOURNAL_NAME]
        for r in read_journal(seg)
        if isinstance(r, p.Received) and isinstance(r.msg, p.Step)
    ]
    for rank in (0, 1):
        assert [s for k, s in rows if k == rank] == list(range(1, steps + 1))
    journal_bytes = segments.journal_bytes(d)
    assert journal_bytes / (2 * steps) <= 60, journal_bytes / (2 * steps)
    listed = json.loads(run_cli("runs", "--json").stdout)
    assert [(r["run"], r["read_from"], r["state"], r["step"]) for r in listed] == [
        (info.run_id, "summary", "exited", steps)
    ]


def test_a_keeper_killed_in_the_middle_of_a_snapshot_leaves_a_readable_run(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "held"
    env = {**os.environ, ENV_SNAPSHOT_HOLD: f"{marker}:3"}  # the third snapshot stops halfway
    info = _launch(tmp_path, 0, segment_mib=64, env=env)
    wait_for(marker.exists, timeout=240, what="the keeper halfway through its third snapshot")
    d = Path(info.run_dir)
    rec = runs.read_record(d)
    assert rec.keeper_pid is not None
    os.kill(rec.keeper_pid, signal.SIGKILL)
    wait_for(lambda: not runs.resolve_run(info.run_id).alive, timeout=60, what="keeper gone")
    try:
        half = d / (snapshot.SNAPSHOT_NAME + ".tmp")
        assert half.exists() and snapshot.read(half) is None  # what the kill left: half a file
        out = run_cli("status", info.run_id, "--json")
        assert out.returncode == 0, out.stderr
        st = json.loads(out.stdout)
        assert st["keeper"] == "gone" and st["state"] == "orphaned" and st["step"] >= 500
        loaded = replay.load(d, runs.fold_of(rec))
        # The second snapshot, then the journal after it.
        assert loaded.source == "snapshot" and loaded.tail_records > 0
        newest = snapshot.read(d / snapshot.SNAPSHOT_NAME)
        assert newest is not None and loaded.records == newest.position.records + loaded.tail_records
        assert (
            msgspec.msgpack.encode(loaded.view.state),
            msgspec.msgpack.encode(loaded.view.series.state()),
        ) == (_full_replay(d))
        assert loaded.view.state.journal_damage.regions == 0
        ranks = {r.rank: r.step for r in loaded.view.state.ranks.values()}
        assert set(ranks) == {0, 1} and min(ranks.values()) >= 500
        listed = json.loads(run_cli("runs", "--json").stdout)
        assert [(r["run"], r["read_from"]) for r in listed] == [(info.run_id, "journal")]  # a stale summary
    finally:
        runs.stop_run(d)
