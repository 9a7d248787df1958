"""scripts/gpu_check.py --cpu-rehearsal: the GPU script's keeper flows for real with a CPU trainer
(a keeper, the trainer's group with a second process in it, the keeper's kill, a straggler that
left the group stopped with the dead trainer's flock), so the real GPU run only meets what is
GPU-specific; and every process it started is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.test_gpu_check import SCRIPT, carrying


def test_cpu_rehearsal_runs_the_keeper_flows_and_leaves_nothing_running(trhome: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-rehearsal", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    got = {o["name"]: o for o in report["outcomes"]}
    assert [got[n]["result"] for n in ("bench", "kill", "stale_lock", "cleanup")] == ["pass"] * 4
    kill = got["kill"]
    # The trainer and the holder it spawned into its group: both gone through the keeper's kill.
    assert kill["figures"]["members"] == 2 and "2 processes of pgid" in kill["detail"]
    stale = got["stale_lock"]["figures"]
    assert stale["straggler_state"] == "T" and stale["kill_pids"] == str(stale["straggler_pid"])
    assert (
        f"held by pid {stale['trainer_pid']}: pid {stale['trainer_pid']} no longer exists"
        in got["stale_lock"]["detail"]
    )
    for name in ("trainer_vram", "allocator_ratio", "ghost_memory", "orphan_context"):
        assert got[name]["result"] == "skip" and got[name]["detail"].startswith("skipped: no CUDA device")
    home = Path(report["home"])
    assert got["cleanup"]["figures"]["left"] == 0 and carrying(home) == [] and not home.exists()
