"""A real Hugging Face `Trainer` (a tiny GPT2LMHeadModel from a config, random tokens, nothing
downloaded) under a real keeper, uninstrumented and with the one-line adapter: the step and loss
in `status` match its trainer_state.json, a kill -9 is `dead` at the step it stopped at, the
recogniser (or the adapter) is named, and the resume template was offered for its command."""

from __future__ import annotations

import json
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

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "trainers" / "hf_train.py"
START_S = 240  # importing torch and transformers on a loaded 2-core machine


def start(tmp_path: Path, *extra: str, adapter: bool) -> RunInfo:
    argv = [sys.executable, str(SCRIPT), "--output_dir", str(tmp_path / "out"), "--use_cpu"]
    argv += ["--per_device_train_batch_size", "4", "--logging_steps", "5", "--save_steps", "20", *extra]
    return launch(argv + (["--adapter"] if adapter else []), cwd=str(tmp_path))


def ended(s: dict[str, Any]) -> bool:
    return s["state"] in ("exited", "dead")


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_step_and_loss_match_trainer_state(trhome: Path, tmp_path: Path, adapter: bool) -> None:
    info = start(tmp_path, "--max_steps", "60", adapter=adapter)
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    state = json.loads((tmp_path / "out" / "checkpoint-60" / "trainer_state.json").read_text())
    last = [h for h in state["log_history"] if "loss" in h][-1]
    assert d["state"] == "exited" and d["exit"]["code"] == 0, d["state_reason"]
    assert d["step"] == state["global_step"] == last["step"] == 60
    assert d["instrumented"] is adapter
    if adapter:
        assert d["loss"] == pytest.approx(last["loss"], rel=1e-9)
        assert d["log"]["recogniser"] is None  # the reporter's frames, not log lines
        ckpts = {Path(c["path"]).name: c["step"] for c in d["checkpoints"]}
        assert ckpts == {"checkpoint-20": 20, "checkpoint-40": 40, "checkpoint-60": 60}
    else:
        assert d["loss"] == pytest.approx(last["loss"], rel=1e-3)  # printed to 4 significant digits
        assert d["log"]["recogniser"] == "hf"
    # The script parses TrainingArguments with HfArgumentParser: the template was offered.
    assert d["resume"]["template"].endswith("--resume_from_checkpoint {ckpt_dir}")
    assert d["resume"]["from"].startswith("recognised: parses TrainingArguments with HfArgumentParser")


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_kill_9_is_dead_at_the_step_it_reached(trhome: Path, tmp_path: Path, adapter: bool) -> None:
    # The trainer stops itself once step 13 is done and drawn (not a logging step: the last
    # logged loss is step 10's), so the kill lands at a step the test knows. Steps 0.2 s apart:
    # tqdm draws at most every 0.1 s, so each step is drawn (uninstrumented, the bar is the step).
    info = start(tmp_path, "--max_steps", "200", "--stop_at", "13", "--step_delay", "0.2", adapter=adapter)
    pid = wait_for(lambda: status(info)["pid"], timeout=30, what="the trainer's pid")
    wait_for(
        lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout=START_S, what="stopped at 13"
    )
    os.kill(pid, signal.SIGKILL)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=30, what="dead")
    assert d["exit"]["signal"] == signal.SIGKILL
    if adapter:
        assert d["step"] == 13
    else:
        # Uninstrumented, the step is the last count the training bar drew: tqdm may skip a
        # redraw (its dynamic miniters), so that is 13 or a little before it, never past it.
        log = (Path(info.run_dir) / "trainer.log").read_text(errors="replace")
        drawn = [
            int(n) for n in re.findall(r"^\s*\d+%\|[^|]*\|\s*(\d+)/200 \[", log.replace("\r", "\n"), re.M)
        ]
        assert d["step"] == drawn[-1] and 10 <= d["step"] <= 13, drawn[-5:]
    dead = [f for f in d["findings"] if f["code"] == "DEAD"]
    assert dead and f"step {d['step']}" in dead[0]["message"], dead
    assert d["log"]["recogniser"] == (None if adapter else "hf")


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_a_dataloader_worker_crash_under_the_bar_names_the_workers_exception(
    trhome: Path, tmp_path: Path, adapter: bool
) -> None:
    """The dataset raises KeyError in a DataLoader worker at about step 30: the traceback starts on
    the bar's last redraw (`...it/s]Traceback (most recent call last):`), and torch wraps the
    worker's exception ("Caught KeyError in DataLoader worker process 0." and its frames). DEAD
    names the worker's own exception first, with where it was raised."""
    extra = ["--max_steps", "200", "--dataloader_num_workers", "1", "--fail_after", "120"]
    info = start(tmp_path, *extra, adapter=adapter)
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "dead" and d["exit"]["code"] == 1, d["state_reason"]
    dead = next(f for f in d["findings"] if f["code"] == "DEAD")
    assert "(KeyError: 'boom' (in DataLoader worker process 0))" in dead["message"], dead["message"]
    assert "Original Traceback" not in dead["message"]


def test_the_adapter_sends_one_lr_per_step_the_one_the_trainer_logged(trhome: Path, tmp_path: Path) -> None:
    """The linear schedule moves the LR every step: the step's record (on_step_end) and its log's
    (on_log) carry the LR that step used, the Trainer's own `learning_rate`, not the next one."""
    from trainroom.core.journal.file import read_journal
    from trainroom.core.run import store as runs
    from trainroom.core.wire import protocol as p

    info = start(tmp_path, "--max_steps", "20", adapter=True)
    d = wait_for(lambda: ended(s := status(info)) and s, timeout=START_S, what="the trainer ended")
    assert d["state"] == "exited", d["state_reason"]
    lrs: dict[int, set[float]] = {}
    for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME):
        if isinstance(r, p.Received) and isinstance(r.msg, p.Step) and r.msg.source != "log":
            lrs.setdefault(r.msg.step, set()).update(r.msg.lr)
    assert sorted(lrs) == list(range(1, 21))
    assert all(len(v) == 1 for v in lrs.values()), lrs  # one LR a step
    state = json.loads((tmp_path / "out" / "checkpoint-20" / "trainer_state.json").read_text())
    logged = {h["step"]: h["learning_rate"] for h in state["log_history"] if "learning_rate" in h}
    assert logged and all(next(iter(lrs[s])) == pytest.approx(lr, rel=1e-9) for s, lr in logged.items()), (
        logged,
        lrs,
    )
