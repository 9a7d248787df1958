"""A real PyTorch Lightning `Trainer` (a tiny LightningModule, ModelCheckpoint, a CSVLogger as the
framework's own record) under a real keeper, uninstrumented (the TQDM bar) and with the one-line
adapter: step and loss in `status` match the logged metrics, a kill -9 is `dead` at the step it
stopped at, the recogniser (or the adapter) is named, the adapter's checkpoints carry their step."""

from __future__ import annotations

import csv
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import status
from tests.support.waiting import wait_for
from trainroom.core.run.launch import launch
from trainroom.core.run.store import RunInfo

pytest.importorskip("lightning")

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "trainers" / "lightning_train.py"
START_S = 240  # importing torch and lightning on a loaded 2-core machine


def start(tmp_path: Path, *extra: str, adapter: bool) -> RunInfo:
    # --tqdm: with rich installed (trainroom's textual brings it) Lightning picks the Rich bar,
    # which draws nothing until the end when its output is not a terminal (README).
    argv = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--tqdm", *extra]
    return launch(argv + (["--adapter"] if adapter else []), cwd=str(tmp_path))


def ended(s: dict[str, Any]) -> bool:
    return s["state"] in ("exited", "dead")


def logged(tmp_path: Path) -> dict[int, float]:
    """metrics.csv: row `step` s holds batch s's loss; global_step is s + 1 after it."""
    with open(tmp_path / "out" / "csv" / "version_0" / "metrics.csv") as f:
        return {int(r["step"]) + 1: float(r["train_loss"]) for r in csv.DictReader(f) if r["train_loss"]}


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_step_and_loss_match_the_logged_metrics(trhome: Path, tmp_path: Path, adapter: bool) -> None:
    info = start(tmp_path, "--max-steps", "100", "--every", "20", adapter=adapter)
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    metrics = logged(tmp_path)
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    assert d["step"] == max(metrics) == 100
    assert d["instrumented"] is adapter
    if adapter:
        assert d["loss"] == pytest.approx(metrics[100], rel=1e-6)
        assert d["log"]["recogniser"] is None
        assert d["lr"]["effective"] == [pytest.approx(3e-3 * 0.5**2)]  # StepLR(50, 0.5) after 100 steps
        steps = {Path(c["path"]).name: c["step"] for c in d["checkpoints"]}
        assert {n for n in steps if n != "last.ckpt"} == {
            f"epoch={(s - 1) // 40}-step={s}.ckpt" for s in (20, 40, 60, 80, 100)
        }
        for name, step in steps.items():
            m = re.search(r"step=(\d+)", name)
            assert step == (int(m.group(1)) if m else 100), name
    else:
        assert d["loss"] == pytest.approx(metrics[100], abs=5.1e-3)  # the bar shows 3 digits
        assert d["log"]["recogniser"] == "lightning"
    # A plain Lightning script takes ckpt_path in code: no template, and the plan will say so.
    assert d["resume"]["template"] is None


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_kill_9_is_dead_at_the_step_it_reached(trhome: Path, tmp_path: Path, adapter: bool) -> None:
    info = start(tmp_path, "--max-steps", "200", "--stop-at", "57", adapter=adapter)
    pid = wait_for(lambda: status(info)["pid"], timeout=30, what="the trainer's pid")
    wait_for(
        lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=START_S, what="stopped at 57"
    )
    os.kill(pid, signal.SIGKILL)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=30, what="dead")
    assert d["exit"]["signal"] == signal.SIGKILL
    assert d["step"] == 57  # epoch 1, batch 17 of 40
    assert d["loss"] is not None  # (the CSVLogger had not flushed: the loss is checked above)
    assert d["log"]["recogniser"] == (None if adapter else "lightning")


def test_the_adapter_under_accumulation_reports_each_optimizer_step_once_undivided(
    trhome: Path, tmp_path: Path
) -> None:
    """accumulate_grad_batches=4: Lightning divides the batch's loss by 4 for the backward pass and
    logs it undivided, once per optimizer step. The adapter sends the same: one step record per
    optimizer step, each loss the one Lightning logged for it."""
    from trainroom.core.journal.file import read_journal
    from trainroom.core.run import store as runs
    from trainroom.core.wire import protocol as p

    info = start(
        tmp_path, "--max-steps", "30", "--every", "10", "--accumulate_grad_batches", "4", adapter=True
    )
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    metrics = logged(tmp_path)  # {global step: the loss Lightning logged at it}
    journal = read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
    sent = [
        (r.msg.step, r.msg.loss)
        for r in journal
        if isinstance(r, p.Received) and isinstance(r.msg, p.Step) and r.msg.source != "log"
    ]
    steps = [s for s, _ in sent]
    assert steps == sorted(set(steps)) == list(range(1, 31)), steps  # once each, none at a micro-batch
    for step, loss in sent:
        assert loss == pytest.approx(metrics[step], rel=1e-5), (step, loss, metrics[step])
    assert d["loss"] == pytest.approx(metrics[30], rel=1e-5)


@pytest.mark.parametrize("bar", ["rich", "tqdm-unsized"])
def test_the_bar_recogniser_reaches_max_steps(trhome: Path, tmp_path: Path, bar: str) -> None:
    """Uninstrumented, max_steps=90 over 40-batch epochs: the Rich bar (Lightning's default, drawn
    only at the end when its output is not a terminal) and the TQDM bar of an IterableDataset
    (its total is the steps left: 90, 50, 10, not the epoch's 40) both end at step 90, with the
    loss Lightning logged for it."""
    argv = [
        sys.executable,
        str(SCRIPT),
        "--out",
        str(tmp_path / "out"),
        "--max-steps",
        "90",
        "--every",
        "1000",
    ]
    argv += ["--tqdm", "--iterable"] if bar == "tqdm-unsized" else []
    info = launch(argv, cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    assert d["log"]["recogniser"] == "lightning"
    assert d["step"] == 90
    assert d["loss"] == pytest.approx(logged(tmp_path)[90], abs=5.1e-3)  # the bar shows 3 digits
    if bar == "tqdm-unsized":
        assert "| 40/90 [" in (Path(info.run_dir) / "trainer.log").read_text()  # the total: steps left
