"""Promotion gated by the trainer's own evaluation, end to end: the demo trainer under a real keeper,
its real evaluation (`python -m trainroom.core.demo.evaluate {ckpt}`, the model's loss on fixed
batches) run on each verified candidate. The run diverges on purpose (its LR climbs 300x): the
first checkpoint whose evaluation regresses past the margin is held back, `latest` stays on the
last one that passed, every figure is in `status --json`, and `trainroom eval` reproduces the
latest's figure, or says an evaluation that is not deterministic does not."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import codes, run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.ckpt import layout as ck
from trainroom.core.demo.launcher import demo_eval_command
from trainroom.core.run import store as runs

TORCH_START_S = 240  # a loaded 2-core machine: torch in the trainer, the verifier and each evaluation


def _done(d: dict[str, Any]) -> bool:
    """The trainer ended and every checkpoint it saved has its verdict, and the keeper's disk probe
    has seen the newest promoted one as `latest`."""
    cs = d["checkpoints"]
    verified = [c for c in cs if c["state"] == "verified"]
    return (
        d["state"] in ("exited", "dead")
        and bool(cs)
        and all(c["state"] in ("verified", "held", "rejected") for c in cs)
        and bool(verified)
        and d["latest_checkpoint"] == max(verified, key=lambda c: c["step"])["promoted"]
    )


def test_a_regressing_checkpoint_is_held_and_latest_stays_on_the_last_that_passed(trhome: Path) -> None:
    info = start_demo(
        fault="diverge",
        fault_step=40,
        steps=160,
        ckpt_every=20,
        step_delay=0.0,
        linger_s=600,
        extra={"eval_command": demo_eval_command()},
    )
    # Every verdict in, and the held one's finding raised (the keeper judges it on its next tick).
    d = wait_for(
        lambda: _done(s := status(info)) and "EVAL_REGRESSED" in codes(s) and s,
        timeout=TORCH_START_S * 2,
        what="every verdict and EVAL_REGRESSED",
    )
    cs = d["checkpoints"]
    held = [c for c in cs if c["state"] == "held"]
    verified = [c for c in cs if c["state"] == "verified"]
    assert held, [(c["step"], c["state"], c["reason"]) for c in cs]
    first_held = min(c["step"] for c in held)
    # Everything promoted passed its evaluation and came before the regression.
    assert all(c["eval"]["passed"] and c["eval"]["figure"] > 0 for c in verified)
    assert max(c["step"] for c in verified) < first_held
    # The held one is worse than the best promoted figure by more than the 5 % margin (or not finite).
    best = min(c["eval"]["figure"] for c in verified)
    h = next(c for c in held if c["step"] == first_held)
    assert not h["eval"]["passed"] and h["eval"]["best"] == best
    assert h["eval"]["figure"] is None or h["eval"]["figure"] > best * 1.05
    assert h["reason"].startswith("held back: ")
    # `latest` never moved to it; it stays in quarantine with its reason beside it.
    root = runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)
    last_good = max(verified, key=lambda c: c["step"])
    assert os.readlink(root / ck.LATEST) == Path(last_good["promoted"]).parent.name
    assert Path(h["path"]).parent.name == ck.QUARANTINE and Path(h["path"]).exists()
    assert ck.Quarantine(root).reason(Path(h["path"])) == h["reason"]
    assert "EVAL_REGRESSED" in codes(d)
    f = next(
        f for f in d["findings"] if f["code"] == "EVAL_REGRESSED" and f["evidence"]["step"] == first_held
    )
    assert f"latest stays at step {last_good['step']}" in f["message"]

    # A re-evaluation of the latest reproduces its recorded figure to the 4th decimal.
    out = run_cli("eval", info.run_id, "--json", timeout=TORCH_START_S)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout)
    assert res["step"] == last_good["step"] and res["reproduces"]
    assert abs(res["figure"] - last_good["eval"]["figure"]) <= 5e-5


def test_an_evaluation_that_is_not_deterministic_is_said_not_to_reproduce(trhome: Path) -> None:
    # An evaluation with a random figure (dropout left on, a shuffled eval set): every candidate
    # passes under a wide margin, and a second run of it on the latest gives another figure.
    noisy = f"{shlex.quote(sys.executable)} -c 'import random; print(\"eval_loss=%.6f\" % (2 + random.random()))' {{ckpt}}"
    (trhome / "trainroom.toml").write_text("[eval]\nmargin = 10.0\n")
    info = start_demo(steps=40, ckpt_every=20, step_delay=0.0, linger_s=600, extra={"eval_command": noisy})
    d = wait_for(lambda: _done(s := status(info)) and s, timeout=TORCH_START_S, what="every verdict")
    assert [c["state"] for c in d["checkpoints"]] == ["verified", "verified"]
    out = run_cli("eval", info.run_id, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.startswith("step 40: does not reproduce: ")
    assert "the evaluation is not deterministic" in out.stdout
