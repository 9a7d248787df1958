"""`trainroom runs` from summaries, `--prune-older-than`, and STATE_DISK_LOW: real run dirs
written through the real JournalWriter, the real CLI in a subprocess, real processes standing in
for a live keeper and an orphaned trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import run_cli
from tests.support.synthetic import make_run_dir, run_records, write_run
from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.health.diskguard import DiskUsage
from trainroom.core.health.statedisk import StateDisk, observe, state_disk_low
from trainroom.core.journal.file import Journal
from trainroom.core.journal.writer import JournalUsage
from trainroom.core.probes.procs import start_ticks
from trainroom.core.run import store, summary
from trainroom.core.wire import protocol as p

POLICY = JournalPolicy(snapshot_records=1000, batch_rows=128)


def _age(run_dir: Path, days: float) -> None:
    then = time.time() - days * 86400
    for f in run_dir.iterdir():
        if f.is_file():
            os.utime(f, (then, then))


def _runs_json(home: Path, *args: str) -> list[dict]:  # type: ignore[type-arg]
    out = run_cli("runs", "--json", *args, env={**os.environ, "TRAINROOM_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_runs_reads_the_summary_and_falls_back_when_it_is_stale(trhome: Path) -> None:
    d, rec = make_run_dir(trhome)
    live, _w = write_run(d, rec, run_records(1500, ranks=2), POLICY)
    (row,) = _runs_json(trhome)
    assert row["read_from"] == "summary" and row["keeper"] == "gone"
    assert row["state"] == "exited" and row["attempt"] == 2
    assert row["step"] == live.state.current_step() and row["steps_total"] == live.state.steps_total
    s = summary.read(d)
    assert s is not None and summary.fresh(s, d / store.JOURNAL_NAME)
    # The journal grew after the summary (a keeper killed between two): not trusted; the run is
    # read from its snapshot and journal tail, and says the same thing.
    before = (d / store.JOURNAL_NAME).stat().st_size
    j = Journal(d / store.JOURNAL_NAME)
    j.append(p.KeeperNote(t=time.time(), message="after the summary"))
    j.close()
    assert (d / store.JOURNAL_NAME).stat().st_size > before
    (row2,) = _runs_json(trhome)
    assert row2["read_from"] == "journal"
    assert {k: v for k, v in row2.items() if k != "read_from"} == {
        k: v for k, v in row.items() if k != "read_from"
    }


def test_runs_text_shows_state_step_and_the_worst_finding(trhome: Path) -> None:
    d, rec = make_run_dir(trhome)
    live, _w = write_run(d, rec, run_records(1000, ranks=2), POLICY)
    out = run_cli("runs", env={**os.environ, "TRAINROOM_HOME": str(trhome)})
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    assert line.startswith(rec.run_id) and " exited " in line and f"step {live.state.current_step()}" in line
    assert "keeper gone" in line


def _keeper_stand_in(rec: store.RunRecord, run_dir: Path) -> subprocess.Popen[bytes]:
    """A live process the run record names as its keeper (pid, start time and ticks)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    rec.keeper_pid = proc.pid
    rec.keeper_start_time = psutil.Process(proc.pid).create_time()
    rec.keeper_start_ticks = start_ticks(proc.pid)
    store.write_record(run_dir, rec)
    return proc


def test_prune_older_than_plans_first_and_never_touches_a_live_run(trhome: Path) -> None:
    old, old_rec = make_run_dir(trhome, "20250101-000000-old-0001")
    write_run(old, old_rec, run_records(300, ranks=1, attempts=1), POLICY)
    live, live_rec = make_run_dir(trhome, "20250101-000000-live-0002")
    write_run(live, live_rec, run_records(300, ranks=1, attempts=1), POLICY)
    orphan, orphan_rec = make_run_dir(trhome, "20250101-000000-orph-0003")
    write_run(orphan, orphan_rec, run_records(300, ranks=1, attempts=1), POLICY)
    ckpt, ckpt_rec = make_run_dir(trhome, "20250101-000000-ckpt-0004")
    write_run(ckpt, ckpt_rec, run_records(300, ranks=1, attempts=1), POLICY)
    (ckpt / "checkpoints" / "step-000100").mkdir(parents=True)
    (ckpt / "checkpoints" / "step-000100" / "model.pt").write_bytes(b"\0" * 4096)
    recent, recent_rec = make_run_dir(trhome, "20250101-000000-new-0005")
    write_run(recent, recent_rec, run_records(300, ranks=1, attempts=1), POLICY)
    keeper = _keeper_stand_in(live_rec, live)
    # An orphaned trainer: its keeper is gone, it still carries the run's id.
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "TRAINROOM_RUN": orphan_rec.run_id},
    )
    try:
        for d in (old, live, orphan, ckpt):
            _age(d, 40)
        env = {**os.environ, "TRAINROOM_HOME": str(trhome)}
        dry = run_cli("runs", "--prune-older-than", "30d", env=env)
        assert dry.returncode == 0, dry.stderr
        text = dry.stdout
        assert f"would delete {old_rec.run_id}" in text and "dry run: nothing deleted" in text
        assert f"keep {live_rec.run_id}: its keeper (pid {keeper.pid}) is alive" in text
        assert f"keep {orphan_rec.run_id}: a live process still carries its id" in text
        assert f"keep {ckpt_rec.run_id}: holds 1 checkpoint file(s)" in text
        assert recent_rec.run_id not in text
        assert all(d.exists() for d in (old, live, orphan, ckpt, recent))
        done = run_cli("runs", "--prune-older-than", "30d", "--yes", "--json", env=env)
        assert done.returncode == 0, done.stderr
        res = json.loads(done.stdout)["result"]
        assert res["deleted"] == [old_rec.run_id] and res["freed_bytes"] > 0
        assert not old.exists() and all(d.exists() for d in (live, orphan, ckpt, recent))
        with_ck = run_cli("runs", "--prune-older-than", "30d", "--with-checkpoints", "--yes", env=env)
        assert with_ck.returncode == 0 and not ckpt.exists() and live.exists() and orphan.exists()
    finally:
        for proc in (keeper, trainer):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prune-older-than", "soon"], "expected a duration such as 12h, 30d or 2w"),
        (["--prune-older-than=-3d"], "expected a duration between 0s and 100 years"),
        (["--prune-older-than", "inf"], "expected a duration"),
        (["--yes"], "--yes and --with-checkpoints go with --prune-older-than"),
    ],
)
def test_bad_prune_input_is_one_line_and_exit_2(trhome: Path, args: list[str], says: str) -> None:
    out = run_cli("runs", *args, env={**os.environ, "TRAINROOM_HOME": str(trhome)})
    assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, (
        out.stderr
    )


def _usage(frac: float, total: int = 100 << 30) -> DiskUsage:
    used = int(total * frac)
    return DiskUsage(path="/state", total_bytes=total, used_bytes=used, free_bytes=total - used)


def _journal(bytes_per_h: float | None, size: int = 800 << 20) -> JournalUsage:
    return JournalUsage(
        path="/state/runs/r", bytes=size, segments=3, lean_segments=1, bytes_per_h=bytes_per_h
    )


def test_state_disk_low_names_the_journal_share_and_rate() -> None:
    assert state_disk_low(StateDisk(usage=_usage(0.5), journal=_journal(50e6)), 0.85, 0.94) is None
    f = state_disk_low(StateDisk(usage=_usage(0.9), journal=_journal(50e6)), 0.85, 0.94)
    assert f is not None and f.code == "STATE_DISK_LOW" and f.severity == "warning"
    assert "journal takes 800 MiB" in f.message and "/h" in f.message and "--prune-older-than" in f.message
    assert f.evidence["journal_bytes"] == 800 << 20
    assert (
        state_disk_low(StateDisk(usage=_usage(0.95), journal=_journal(None)), 0.85, 0.94).severity
        == "critical"
    )  # type: ignore[union-attr]
    # The checkpoint root is on the same disk: DISK_HIGH says it is full; this says nothing more...
    assert (
        state_disk_low(StateDisk(usage=_usage(0.9), journal=_journal(1e6), covered=True), 0.85, 0.94) is None
    )
    # ... unless the journal alone fills it within hours: 5 GiB free at 1 GiB/h.
    near = StateDisk(usage=_usage(0.95, total=100 << 30), journal=_journal(float(1 << 30)), covered=True)
    g = state_disk_low(near, 0.85, 0.94)
    assert g is not None and g.severity == "warning" and 4 * 3600 < g.evidence["time_to_full_s"] < 6 * 3600
    soon = StateDisk(usage=_usage(0.999), journal=_journal(float(1 << 30)), covered=True)
    assert state_disk_low(soon, 0.85, 0.94).severity == "critical"  # type: ignore[union-attr]


def test_observe_reads_this_disk_and_tells_a_shared_one(tmp_path: Path) -> None:
    obs = observe(tmp_path, _journal(None), str(tmp_path / "checkpoints"), ckpt_budget=False)
    st = os.statvfs(tmp_path)
    assert obs.usage.total_bytes == st.f_blocks * st.f_frsize and obs.covered
    assert not observe(tmp_path, _journal(None), str(tmp_path), ckpt_budget=True).covered
