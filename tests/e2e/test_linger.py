"""Runs that end cost nothing: the keeper of an ended run rests (a slow probe, no tick between)
and exits after its linger unless a viewer is attached; resting, it still verifies a checkpoint
written just before the end and still sees a process of the run left behind; `stop-keeper` ends
one at once and refuses while a trainer runs; "live" is a trainer that runs; the demo ends by
itself. Every test drives real keeper processes (the one stand-in: the fake NVML's process list)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.run.live import trainer_runs
from trainroom.core.wire import protocol as p

NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"
START_S = 240.0  # torch's import in the trainer and in the verifier, on a loaded 2-core machine
GIB = 1 << 30
H200 = {"name": "NVIDIA H200", "total_bytes": 141 * GIB}

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


def _rests(info: runs.RunInfo) -> list[p.KeeperNote]:
    return [n for n in _notes(info) if "the keeper rests" in n.message]


def _rested(info: runs.RunInfo) -> p.KeeperNote | None:
    return next(iter(_rests(info)), None)


def _woke(info: runs.RunInfo) -> list[str]:
    return [n.message for n in _notes(info) if "the keeper stops resting" in n.message]


def _cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_over(pid: int, seconds: float) -> float:
    """CPU seconds the process takes over `seconds` of wall clock (a window, waited on the clock)."""
    c0, t0 = _cpu_s(pid), time.time()
    wait_for(lambda: time.time() > t0 + seconds, timeout=seconds + 30, what=f"a {seconds:.0f} s window")
    return _cpu_s(pid) - c0


def _keeper_alive(info: runs.RunInfo) -> bool:
    return runs.keeper_alive(runs.read_record(Path(info.run_dir)))


def test_a_resting_keeper_takes_a_fraction_of_the_cpu_it_took_while_its_trainer_ran(
    trhome: Path, tmp_path: Path
) -> None:
    info, stop = _launch(tmp_path, "cpu", linger_s=600.0)
    wait_for(lambda: status(info)["step"], timeout=60, what="steps")
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    training = _cpu_over(keeper, 10.0)
    assert _rested(info) is None  # a training run is watched, not rested
    stop.touch()
    wait_for(lambda: _rested(info), timeout=60, what="the keeper to rest")
    resting = _cpu_over(keeper, 10.0)
    # Measured here: about 1.1 % of a core for an ended run's keeper before it rested, 0.13 %
    # resting (a probe every 5 s); a trainer's 20 steps a second cost the keeper more still.
    assert resting < training / 3, (resting, training)
    assert _keeper_alive(info) and not _woke(info)


def test_an_ended_runs_keeper_rests_then_exits_after_its_linger(trhome: Path, tmp_path: Path) -> None:
    info, stop = _launch(tmp_path, "a", linger_s=2.0)
    wait_for(lambda: _keeper_alive(info), timeout=30, what="the keeper")
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


def _verified(d: dict[str, Any], path: Path) -> bool:
    return any(c["path"] == str(path) and c["state"] == "verified" for c in d["checkpoints"])


def test_a_checkpoint_written_just_before_the_end_is_verified_and_promoted(
    trhome: Path, tmp_path: Path
) -> None:
    """nanoGPT's save is its last act: the trainer ends while its checkpoint still settles. The
    keeper verifies it and keeps a verified copy before it rests, and its linger (1 s here) does
    not end it meanwhile."""
    info = launch(
        [sys.executable, str(NANOGPT_LIKE), "--iters", "10", "--save-every", "10"],
        LaunchOptions(watch_ckpt=["out/*.pt"], keep_verified_copies=True, linger_s=1.0),
        cwd=str(tmp_path),
    )
    ckpt = tmp_path / "out" / "ckpt.pt"
    root = str(runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir))

    def copies(d: dict[str, Any]) -> list[dict[str, Any]]:
        return [c for c in d["checkpoints"] if c["state"] == "verified" and root in c["path"]]

    d = wait_for(
        lambda: (s := status(info))["state"] == "exited" and _verified(s, ckpt) and copies(s) and s,
        timeout=START_S,
        what="the run exited, its last checkpoint verified and a verified copy kept",
    )
    assert Path(copies(d)[0]["path"]).is_file(), d["checkpoints"]
    rest = wait_for(lambda: _rested(info), timeout=60, what="the keeper to rest")
    verdict = next(
        r
        for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, p.CheckpointState) and r.path == str(ckpt) and r.state == "verified"
    )
    assert verdict.t <= rest.t  # verified before it rested, not found by chance after
    wait_for(lambda: not _keeper_alive(info), timeout=60, what="the keeper to exit after its linger")


def test_a_resting_keeper_still_sees_a_process_of_the_run_left_behind(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = tmp_path / "gpu.json"
    write_scenario(gpu, {"devices": [{**H200, "used_bytes": 0}]})
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    info, stop = _launch(tmp_path, "left", linger_s=600.0)
    stop.touch()
    wait_for(lambda: _rested(info), timeout=60, what="the keeper to rest")
    # A process of the ended attempt (its environment names the run and the attempt, as a
    # straggler's does) that holds a GPU context the driver lists.
    env = os.environ | {"TRAINROOM_RUN": info.run_id, "TRAINROOM_ATTEMPT": "1"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        write_scenario(
            gpu,
            {"devices": [{**H200, "used_bytes": GIB}], "processes": [{"pid": child.pid, "used_bytes": GIB}]},
        )
        f = wait_for(
            lambda: next((f for f in status(info)["findings"] if f["code"] == "ORPHAN_CONTEXT"), None),
            timeout=60,
            what="ORPHAN_CONTEXT seen by the resting keeper",
        )
        assert f["target"]["pids"] == [child.pid], f
        woke = wait_for(lambda: _woke(info), timeout=60, what="the keeper to stop resting")
        assert "a process of the run is left behind" in woke[0] or "about the machine" in woke[0], woke
    finally:
        child.kill()
        child.wait()
    write_scenario(gpu, {"devices": [{**H200, "used_bytes": 0}]})
    # Gone, and the driver let its memory go: the keeper rests again.
    wait_for(lambda: len(_rests(info)) >= 2, timeout=60, what="the keeper to rest again")
    assert not any(f["code"] == "ORPHAN_CONTEXT" for f in status(info)["findings"])


def test_the_demo_ends_by_itself(trhome: Path) -> None:
    done = run_cli("demo", "--no-tui", "--steps", "20", "--step-delay", "0", timeout=START_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EXITED (exited 0)" in done.stdout and "step 20" in done.stdout, done.stdout


def test_trainroom_toml_sets_the_linger_the_longer_linger_after_a_death_and_the_rest_probe(
    trhome: Path, tmp_path: Path
) -> None:
    (tmp_path / "trainroom.toml").write_text(
        "[keeper]\nlinger_s = 1\ndead_linger_s = 600\nrest_probe_s = 2\n"
    )
    script = tmp_path / "dies.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    info = launch([sys.executable, str(script)], LaunchOptions(), cwd=str(tmp_path))
    rest = wait_for(lambda: _rested(info), timeout=60, what="the dead run's keeper to rest")
    # Died: it waits for a resume the dead linger, not the 1 s of an ended run.
    assert "a probe every 2 s" in rest.message and "once 600 s pass" in rest.message, rest.message
    assert status(info)["state"] == "dead" and _keeper_alive(info)
    done = run_cli("stop-keeper", info.run_id)
    assert done.returncode == 0 and "exited" in done.stdout, done
