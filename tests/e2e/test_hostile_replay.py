"""Replay never touches the live run: a trainer that ignores the replay request trains from scratch
and saves into the checkpoint root its own command line names (the run's root); the replay's saves
go to a scratch root of the replay's own, and the run's checkpoints and `latest` are as they were.
While the run still trains, replay refuses, saying why."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.run.launch import launch

TRAINER = Path(__file__).resolve().parents[1] / "support" / "trainers" / "ignores_replay.py"
TORCH_START_S = 240


def _tree(root: Path) -> dict[str, Any]:
    latest = root / "latest"
    return {
        "latest": os.readlink(latest) if latest.is_symlink() else None,
        "entries": sorted(p.name for p in root.iterdir()),
        "steps": sorted(p.name for p in root.iterdir() if p.name.startswith("step-")),
    }


def test_a_replay_that_trains_from_scratch_never_moves_the_runs_checkpoints(
    trhome: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ckpts"
    hold = tmp_path / "hold"
    argv = [sys.executable, str(TRAINER), "--root", str(root), "--steps", "40", "--hold", str(hold)]
    info = launch(argv, {"ckpt_root": str(root), "linger_s": 600}, cwd=str(tmp_path))

    def training() -> dict[str, Any] | None:
        d = status(info)
        return d if any(f["code"] == "LOSS_SPIKE" for f in d["findings"]) else None

    wait_for(training, timeout=TORCH_START_S, what="the spike at step 25 seen while the run trains")
    out = run_cli("replay", info.run_id, "--step", "25", timeout=TORCH_START_S)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "is still training" in out.stderr and "replay once it has ended" in out.stderr, out.stderr
    hold.touch()

    def done() -> dict[str, Any] | None:
        d = status(info)
        verified = [c for c in d["checkpoints"] if c["state"] == "verified"]
        return d if d["state"] == "exited" and len(verified) == 4 else None

    wait_for(done, timeout=TORCH_START_S, what="the run ended with its 4 checkpoints verified")
    before = _tree(root)
    assert before["latest"] is not None and before["latest"].endswith("step-000040"), before

    out = run_cli("replay", info.run_id, "--step", "25", timeout=TORCH_START_S)
    # The trainer trained 40 steps from scratch and printed no replay_loss: one line, exit 2.
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "printed no replay_loss=" in out.stderr, out.stderr
    assert _tree(root) == before  # no step directory added, `latest` where it was
    scratch = list((Path(info.run_dir) / "replays").iterdir())
    assert len(scratch) == 1
    saved = sorted(p.name for p in (scratch[0] / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert saved == ["step-000010", "step-000020", "step-000030", "step-000040"], saved
