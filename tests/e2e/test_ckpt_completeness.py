"""Completeness end to end: an uninstrumented nanoGPT-shaped trainer under a real keeper saves
`out/ckpt.pt` with its optimizer at iteration 10 and without it from iteration 20 (a weights-only
save partway). The keeper's watch verifies each version and keeps a verified copy; the second
lacks what the first held: CKPT_INCOMPLETE names it, `status --json` shows each checkpoint's
completeness, and the resume plan says what a resume from it loses."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.actions import render
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch

NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"
TORCH_START_S = 120  # a loaded 2-core machine: importing torch in trainer and verifier


def test_a_save_without_the_optimizer_partway_is_incomplete_and_the_resume_plan_says_what_is_lost(
    trhome: Path, tmp_path: Path
) -> None:
    work = tmp_path / "nanogpt"
    work.mkdir()
    argv = [sys.executable, str(NANOGPT_LIKE), "--iters", "20", "--save-every", "10", "--wait-copies"]
    info = launch(
        [*argv, "--drop-optimizer-from", "20"],
        {"watch_ckpt": ["out/*.pt"], "keep_verified_copies": True},
        cwd=str(work),
    )

    def said(d: dict[str, Any]) -> bool:
        latest = d["latest_checkpoint"] or ""
        incomplete = [f for f in d["findings"] if f["code"] == "CKPT_INCOMPLETE"]
        return d["state"] == "dead" or (
            d["state"] == "exited" and latest.endswith("/step-000020/ckpt.pt") and bool(incomplete)
        )

    d = wait_for(lambda: said(s := status(info)) and s, timeout=TORCH_START_S + 60, what="CKPT_INCOMPLETE")
    assert d["state"] == "exited", (Path(info.run_dir) / runs.LOG_NAME).read_text()[-2000:]
    root = str(Path(d["latest_checkpoint"]).parents[1])
    by_path = {c["path"]: c for c in d["checkpoints"]}
    first = by_path[f"{root}/step-000010/ckpt.pt"]["completeness"]
    second = by_path[f"{root}/step-000020/ckpt.pt"]["completeness"]
    # Each version as the verifier read it: AdamW's moments at 10, none at 20.
    assert first["parts"]["optimizer"]["seen"].startswith("optimizer: AdamW moments for ")
    assert first["marks"] == "model opt sched -rng -data" and "optimizer" not in first["lacks"]
    assert second["marks"] == "model -opt sched -rng -data" and "optimizer" in second["lacks"]
    assert second["parts"]["step"]["seen"] == "iter_num 20"

    (f,) = [f for f in d["findings"] if f["code"] == "CKPT_INCOMPLETE"]
    assert f["severity"] == "warning" and f["evidence"]["lacks"] == ["optimizer"]
    assert f["evidence"]["first_step"] == 10 and f["evidence"]["step"] == 20
    assert "its first checkpoint (step 10) held it" in f["message"] and "Adam restarts cold" in f["message"]

    # The resume plan (not carried out) names what a resume from step 20 loses, first.
    plan = KeeperClient(info.sock).call("resume", {}, confirm=False)
    assert plan.stage == "plan" and plan.plan is not None, plan.message
    assert plan.plan["step"] == 20
    assert plan.plan["lost"][0] == (
        "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)"
    )
    assert "data position absent: batches 0–20 seen again" in plan.plan["lost"]
    assert "not a faithful resume: 3 part(s) lost or reset" in plan.message
    assert render.plan_lines("resume", plan.plan)[0].startswith("  lost: optimizer moments reset")

    # `trainroom verify` on the kept copy says what it holds and lacks.
    out = run_cli("verify", d["latest_checkpoint"])
    assert out.returncode == 0, out.stderr
    assert "holds: model, scheduler, step, config; lacks: optimizer, rng, data, code" in out.stdout
    out = run_cli("verify", d["latest_checkpoint"], "--json")
    assert json.loads(out.stdout)["completeness"]["parts"]["optimizer"] == {"present": False, "seen": ""}
