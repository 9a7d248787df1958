"""Cause and consequence with a real keeper: `trainroom demo --fault nan` sets a weight to NaN, the
keeper opens NONFINITE on that step, and every checkpoint the NaN model saves after it is rejected.
`status --json` and `status` say NONFINITE as the root cause with the rejections folded under it
as one line with their count, and a rejection says there is no verified checkpoint yet; the
control room's header at 80x24 names NONFINITE, never CKPT_REJECTED, however many pile up."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_tmux import Pane, _trainroom_script, pane_factory  # noqa: F401 (a fixture)
from tests.support.helpers import run_cli, start_demo, status_json
from tests.support.waiting import wait_for


def _rejected(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in d["findings"] if f["code"] == "CKPT_REJECTED"]


def test_a_nan_model_s_rejected_checkpoints_fold_under_nonfinite(trhome: Path) -> None:
    # NaN from step 3 on, a checkpoint every 5 steps: none ever verifies.
    info = start_demo(fault="nan", fault_step=3, step_delay=0.1, ckpt_every=5)
    d = wait_for(
        lambda: (s := status_json(info.run_id)) and len(_rejected(s)) >= 3 and s,
        timeout=180,
        what="three checkpoints of the NaN model rejected",
    )
    nonfinite = next(f for f in d["findings"] if f["code"] == "NONFINITE")
    rejected = _rejected(d)
    assert all(f["cause"] == nonfinite["ident"] for f in rejected) and nonfinite["cause"] is None
    # One row for the cause and its consequences; no row of its own for any rejection.
    rows = d["finding_rows"]
    assert [r["code"] for r in rows].count("CKPT_REJECTED") == 0
    row = next(r for r in rows if r["code"] == "NONFINITE")
    assert row["severity"] == "critical"
    (k,) = row["consequences"]
    step = nonfinite["evidence"]["step"]
    assert k["code"] == "CKPT_REJECTED" and k["count"] == len(rejected) == len(k["idents"])
    assert k["since"] == f"{len(rejected)} checkpoints rejected since NONFINITE at step {step}"
    newest = max(rejected, key=lambda f: f["first_seen"])
    assert k["latest"] == newest["ident"] and k["text"].endswith(newest["message"])
    # No verified checkpoint exists: the rejection says so, and never speaks of one.
    assert "no checkpoint has verified yet: there is none to resume from" in newest["message"]
    assert "left as it was" not in newest["message"]
    # The text: the cause's line, the rejections one indented line under it.
    out = run_cli("status", info.run_id)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if re.match(r"\s+CRITICAL NONFINITE: ", line))
    assert re.match(
        rf"\s+↳ CRITICAL \d+ checkpoints rejected since NONFINITE at step {step}; the latest: checkpoint step",
        lines[at + 1],
    ), lines
    assert not any("CKPT_REJECTED:" in line for line in lines), lines


def test_tmux_the_header_at_80x24_names_nonfinite_while_rejections_pile_up(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811 (the fixture imported above)
) -> None:
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory((80, 24))
    pane.start(f"{shlex.quote(script)} demo --fault nan --fault-step 3 --step-delay 0.1 --ckpt-every 5")
    folded = re.compile(r"↳ CRIT (\d+) checkpoints rejected since NONFINITE at step \d+")

    def three_folded() -> str | None:
        text = pane.text()
        m = folded.search(text)
        return text if m and int(m.group(1)) >= 3 else None

    text = wait_for(three_folded, timeout=180, interval=0.25, what="three rejections folded under NONFINITE")
    header = text.splitlines()[0]
    assert " RUNNING  NONFINITE" in header and "CKPT_REJECTED" not in header, header
    assert "CRIT CKPT_REJECTED" not in text, text
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)


def test_tmux_a_runaway_lr_is_the_root_of_the_divergence_it_causes_at_80x24(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811 (the fixture imported above)
) -> None:
    """`demo --fault diverge --eval`: the LR climbs x1.05 a step from step 30 to 300x the requested
    one. LR_RUNAWAY opens first (10x, step 78) and is the root: the spike, the held and the
    rejected checkpoints fold under it; the row is CRIT and its CRIT line stays in view at 80x24;
    `status` says the same row in the same words."""
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory((80, 24))
    pane.start(f"{shlex.quote(script)} demo --fault diverge --eval --step-delay 0.03")
    folded = re.compile(r"↳ CRIT (\d+) checkpoints? rejected since LR_RUNAWAY at step (\d+)")
    text = wait_for(
        lambda: (t := pane.text()) and folded.search(t) and "CRIT LR_RUNAWAY" in t and t,
        timeout=240,
        interval=0.25,
        what="the rejections folded under LR_RUNAWAY at 80x24",
    )
    run_id = re.search(r"\d{8}-\d{6}-train-[0-9a-f]{4}", text.splitlines()[0])
    assert run_id is not None, text
    d = status_json(run_id.group(0))
    runaway = next(r for r in d["finding_rows"] if r["code"] == "LR_RUNAWAY")
    assert runaway["severity"] == "critical" and d["finding_rows"][0]["code"] == "LR_RUNAWAY"
    under = {k["code"] for k in runaway["consequences"]}
    assert {"LOSS_SPIKE", "CKPT_REJECTED"} <= under, runaway
    # Nothing that follows from the LR stands as a root of its own.
    assert not {"LOSS_SPIKE", "CKPT_REJECTED", "EVAL_REGRESSED"} & {r["code"] for r in d["finding_rows"]}
    step = next(f for f in d["findings"] if f["code"] == "LR_RUNAWAY")["evidence"]["step"]
    m = folded.search(text)
    assert m is not None and int(m.group(2)) == step
    # `status` says the row and each consequence in the TUI's words.
    out = run_cli("status", run_id.group(0))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^\s+CRITICAL LR_RUNAWAY: effective LR ", out.stdout, re.M), out.stdout
    assert re.search(rf"↳ CRITICAL \d+ checkpoints? rejected since LR_RUNAWAY at step {step}; ", out.stdout)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
