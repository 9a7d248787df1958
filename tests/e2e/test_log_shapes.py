"""Uninstrumented trainers read from their logs with no --log-pattern, under a real keeper: a
hand-written loop printing a tqdm bar, logging lines or plain prints shows its step and loss in
`status`; a log with nothing recognisable says so; and a step counts optimizer steps (or says
what it counts) where the framework's log counts something else: Lightning's bar with
accumulate_grad_batches=4 (batches), HF with disable_tqdm (logged dicts)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.journal import file as journal
from trainroom.core.logs.logtiming import RATE_WORDS, WINDOW_S
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

TRAINERS = Path(__file__).resolve().parents[1] / "support" / "trainers"
NANOGPT = Path(__file__).resolve().parents[1] / "support" / "nanogpt_like.py"
START_S = 240  # importing torch (and lightning, transformers) on a loaded 2-core machine


def ended(s: dict[str, Any]) -> bool:
    return s["state"] in ("exited", "dead")


def recorded(path: Path) -> dict[int, float]:
    """The loop's own record of each step's loss, as it printed it."""
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.parametrize(
    ("mode", "recogniser", "unit"),
    [
        ("tqdm", "tqdm", "bar count"),
        ("tqdm-desc", "tqdm", "bar count"),
        ("tqdm-write", "lines", "printed steps"),
        ("logging", "lines", "printed steps"),
        ("logging-time", "lines", "printed steps"),
        ("print", "lines", "printed steps"),
    ],
)
def test_a_plain_loop_shows_its_step_and_loss_without_a_pattern(
    trhome: Path, tmp_path: Path, mode: str, recogniser: str, unit: str
) -> None:
    rec = tmp_path / "losses.jsonl"
    argv = [
        sys.executable,
        str(TRAINERS / "plain_train.py"),
        "--mode",
        mode,
        "--steps",
        "60",
        "--record",
        str(rec),
    ]
    info = launch(argv, cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the loop ended")
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    assert d["instrumented"] is False
    assert d["step"] == 60
    assert d["loss"] == recorded(rec)[60]
    assert d["log"] == {"recogniser": recogniser, "unit": unit, "unrecognised": None}


def test_a_log_with_nothing_recognisable_says_to_pass_a_pattern(trhome: Path, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    argv = [sys.executable, str(TRAINERS / "plain_train.py"), "--mode", "nothing", "--hold", str(hold)]
    argv += ["--record", str(tmp_path / "losses.jsonl")]
    info = launch(argv, cwd=str(tmp_path))
    words = "log read but no step or loss recognised in 2"  # 200 lines or a few more, as read
    d = wait_for(
        lambda: (
            words in ((s := status(info))["log"]["unrecognised"] or "") and words in s["state_reason"] and s
        ),
        timeout=START_S,
        what="the log said to be unrecognised",
    )
    assert d["state"] in ("starting", "running") and d["step"] is None
    assert d["log"]["unrecognised"].endswith("pass --log-pattern") and d["log"]["recogniser"] is None
    out = run_cli("status", info.run_id)
    assert out.returncode == 0 and "pass --log-pattern" in out.stdout, out.stdout
    hold.touch()
    wait_for(lambda: ended(status(info)), timeout=60, what="the trainer ended")


def test_lightning_accumulating_4_batches_counts_optimizer_steps_and_the_steps_lost(
    trhome: Path, tmp_path: Path
) -> None:
    """accumulate_grad_batches=4 in the command: the bar's batches are read as optimizer steps, so
    a kill -9 after step 23 is dead at step 23 with 3 steps lost since the checkpoint at 20 (the
    batch count would say 92 and 72)."""
    pytest.importorskip("lightning")
    argv = [sys.executable, str(TRAINERS / "lightning_train.py"), "--out", str(tmp_path / "out"), "--tqdm"]
    argv += ["--max-steps", "200", "--every", "10", "--stop-at", "23", "--accumulate_grad_batches", "4"]
    info = launch(argv, {"watch_ckpt": ["out/ckpt/epoch=*.ckpt"]}, cwd=str(tmp_path))
    pid = wait_for(lambda: status(info)["pid"], timeout=30, what="the trainer's pid")
    wait_for(
        lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=START_S, what="stopped at 23"
    )
    wait_for(
        lambda: any(c["step"] == 20 and c["state"] == "verified" for c in status(info)["checkpoints"]),
        timeout=START_S,
        what="the step-20 checkpoint verified",
    )
    os.kill(pid, signal.SIGKILL)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=60, what="dead")
    assert d["step"] == 23  # epoch 2 (10 steps an epoch), batch 12 of 40: 20 + 12 // 4
    assert d["log"]["recogniser"] == "lightning" and d["log"]["unit"] == "optimizer steps"
    dead = next(f for f in d["findings"] if f["code"] == "DEAD")
    assert dead["evidence"]["last_verified_step"] == 20
    assert dead["evidence"]["steps_lost"] == 3, dead["message"]
    assert "3 steps lost since the last verified checkpoint (step 20)" in dead["message"]


def test_hf_with_disable_tqdm_counts_optimizer_steps_by_its_logging_steps(
    trhome: Path, tmp_path: Path
) -> None:
    """No bar: the Trainer prints a dict every logging_steps (5, in the command) optimizer steps;
    the step is the dicts times 5, what trainer_state.json says, not the dicts counted."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    argv = [sys.executable, str(TRAINERS / "hf_train.py"), "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    argv += ["--per_device_train_batch_size", "4", "--logging_steps", "5", "--save_steps", "20"]
    argv += ["--max_steps", "60", "--disable_tqdm", "True"]
    info = launch(argv, cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    state = json.loads((tmp_path / "out" / "checkpoint-60" / "trainer_state.json").read_text())
    last = [h for h in state["log_history"] if "loss" in h][-1]
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    assert d["step"] == state["global_step"] == last["step"] == 60
    assert d["loss"] == pytest.approx(last["loss"], rel=1e-3)
    assert d["log"]["recogniser"] == "hf" and d["log"]["unit"] == "optimizer steps"


def test_an_lr_with_an_exponent_in_a_tqdm_postfix_is_read(trhome: Path, tmp_path: Path) -> None:
    """tqdm prints a small LR as `lr=3e-5` (its `.3g`, `-0` dropped): the exponent is kept."""
    rec = tmp_path / "losses.jsonl"
    argv = [sys.executable, str(TRAINERS / "plain_train.py"), "--mode", "tqdm", "--steps", "30"]
    info = launch([*argv, "--lr", "3e-5", "--record", str(rec)], cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the loop ended")
    assert d["state"] == "exited" and d["step"] == 30
    assert "lr=3e-5" in (Path(info.run_dir) / "trainer.log").read_text()
    assert d["lr"]["effective"] == [3e-5]


def true_pace(path: Path, key: str = "step", steps: int | None = None, seconds: float | None = None) -> float:
    """The trainer's own pace by its record of each step's end time: over its last `steps` steps,
    or its last `seconds` (the window the figure is read over: core/logs/logtiming, run/figures)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    if steps is not None:
        rows = [r for r in rows if r[key] >= rows[-1][key] - steps]
    if seconds is not None:
        rows = [r for r in rows if r["t"] >= rows[-1]["t"] - seconds]
    return float((rows[-1][key] - rows[0][key]) / (rows[-1]["t"] - rows[0]["t"]))


PACES: dict[str, tuple[list[str], str, dict[str, float]]] = {
    # A loop printing every 10th step, no timing on its lines: the steps between its last 32
    # records over the times they were read.
    "print-every-10": (["--mode", "print-every-10", "--steps", "400"], "read times", {"steps": 310}),
    # tqdm's count over its elapsed time (its last 30 s); `logging`'s asctime (the last 32 lines).
    "tqdm": (["--mode", "tqdm", "--steps", "400"], "bar rate", {"seconds": WINDOW_S}),
    "logging-time": (["--mode", "logging-time", "--steps", "300"], "timestamps", {"steps": 31}),
}


@pytest.mark.parametrize("shape", sorted(PACES))
def test_steps_per_s_of_a_plain_loop_is_its_own_pace_and_says_where_it_came_from(
    trhome: Path, tmp_path: Path, shape: str
) -> None:
    """steps/s within 25 % of the loop's own pace (its record of each step's time), whatever each
    record covers, with its source; not 1 / the gap between records (1.08 for a true 11)."""
    args, source, window = PACES[shape]
    rec = tmp_path / "losses.jsonl"
    argv = [
        sys.executable,
        str(TRAINERS / "plain_train.py"),
        *args,
        "--step-delay",
        "0.02",
        "--record",
        str(rec),
    ]
    info = launch(argv, cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the loop ended")
    assert d["state"] == "exited" and d["step"] == int(args[-1])
    true = true_pace(rec, **window)  # type: ignore[arg-type]
    # Ended: no live rate (`steps_per_s` is null once no steps come), the last one beside it.
    assert d["steps_per_s"] is None and d["steps_per_s_from"] == source
    assert d["steps_per_s_last"] == pytest.approx(true, rel=0.25), (d["steps_per_s_last"], true)
    text = run_cli("status", info.run_id).stdout
    assert f"steps/s ({RATE_WORDS[source]})" in text, text


def test_steps_per_s_of_nanogpt_is_read_from_its_iteration_times(trhome: Path, tmp_path: Path) -> None:
    """nanoGPT's default log_interval=10: `iter 10: loss X, time Yms` every 10th iteration; the
    pace is its iteration times' (0.74 for a true 7.7 when it was 1 / the gap between records)."""
    rec = tmp_path / "iters.jsonl"
    argv = [sys.executable, str(NANOGPT), "--iters", "400", "--log-interval", "10", "--save-every", "100000"]
    info = launch(
        [*argv, "--delay", "0.02", "--record", str(rec), "--out_dir", str(tmp_path / "out")],
        cwd=str(tmp_path),
    )
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited" and d["step"] == 400 and d["log"]["recogniser"] == "nanogpt"
    true = true_pace(rec, "iter", steps=310)  # its last 32 lines, the first of them the window's start
    assert d["steps_per_s_from"] == "iteration times"
    assert d["steps_per_s_last"] == pytest.approx(true, rel=0.25), (d["steps_per_s_last"], true)


def test_steps_per_s_of_lightning_accumulating_4_batches_is_its_bars_pace_in_optimizer_steps(
    trhome: Path, tmp_path: Path
) -> None:
    """Lightning's TQDM bar counts batches: under accumulate_grad_batches=4 its pace is a quarter
    of them in optimizer steps, within 25 % of the trainer's own step times."""
    pytest.importorskip("lightning")
    rec = tmp_path / "batches.jsonl"
    argv = [sys.executable, str(TRAINERS / "lightning_train.py"), "--out", str(tmp_path / "out"), "--tqdm"]
    argv += ["--max-steps", "100", "--batches", "400", "--every", "100000", "--accumulate_grad_batches", "4"]
    info = launch([*argv, "--step-delay", "0.02", "--record", str(rec)], cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited" and d["step"] == 100, d["state_reason"]
    assert d["log"]["recogniser"] == "lightning" and d["log"]["unit"] == "optimizer steps"
    true = true_pace(rec, seconds=WINDOW_S)
    assert d["steps_per_s_from"] == "bar rate"
    assert d["steps_per_s_last"] == pytest.approx(true, rel=0.25), (d["steps_per_s_last"], true)


def test_steps_per_s_of_an_hf_trainer_is_its_bars_rate(trhome: Path, tmp_path: Path) -> None:
    """HF's training bar (`45/80 [00:05<00:04, 8.20it/s]`): its rate, within 25 % of the Trainer's
    own step times (9.85 for a true 8.2 when it was 1 / the gap between records)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    rec = tmp_path / "steps.jsonl"
    argv = [sys.executable, str(TRAINERS / "hf_train.py"), "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    argv += ["--per_device_train_batch_size", "4", "--logging_steps", "10", "--save_strategy", "no"]
    argv += ["--max_steps", "120", "--step_delay", "0.03", "--record", str(rec)]
    info = launch(argv, cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited" and d["step"] == 120 and d["log"]["recogniser"] == "hf", d["state_reason"]
    true = true_pace(rec, seconds=WINDOW_S)
    assert d["steps_per_s_from"] == "bar rate"
    assert d["steps_per_s_last"] == pytest.approx(true, rel=0.25), (d["steps_per_s_last"], true)


@pytest.mark.parametrize(("diverge_at", "diverges"), [(0, False), (300, True)])
def test_divergence_from_a_bar_drawn_every_other_step(
    trhome: Path, tmp_path: Path, diverge_at: int, diverges: bool
) -> None:
    """A minibatch loop (healthy, noisy loss) whose tqdm bar is drawn every other step: the noise
    of the sampled records is no DIVERGENCE (it was, at step ~360); the same loop turned to
    gradient ascent at step 300 is one, from after the turn."""
    rec = tmp_path / "losses.jsonl"
    argv = [sys.executable, str(TRAINERS / "plain_train.py"), "--mode", "tqdm-sampled", "--steps", "500"]
    argv += ["--batch", "8", "--show-every", "2", "--diverge-at", str(diverge_at), "--step-delay", "0.005"]
    info = launch([*argv, "--record", str(rec)], cwd=str(tmp_path))
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the loop ended")
    assert d["state"] == "exited" and d["step"] == 500 and d["loss"] == recorded(rec)[500]
    raised = [
        r.finding
        for r in journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, protocol.FindingRaised) and r.finding.code == "DIVERGENCE"
    ]
    if not diverges:
        assert raised == [], raised[0].message
        return
    assert raised, "no DIVERGENCE on a loss rising from step 300"
    ev = raised[0].evidence
    assert ev["since_step"] > diverge_at and ev["best_step"] < diverge_at
    assert ev["median"] > ev["best"] + ev["band"]
