"""The verifier warm from launch: `WarmVerifier.warm()` starts the child without waiting (the
first verification then starts nothing), and the keeper's pipeline says when checkpoints are
expected (what starts it with the keeper)."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import torch

from tests.support.ckpt_fixtures import small_state
from trainroom.core.ckpt.verifier import WarmVerifier
from trainroom.core.configuration.config import Config
from trainroom.core.configuration.settings import LaunchOptions, RunSettings, resolve
from trainroom.core.keeper.pipeline import expecting_checkpoints


def test_warm_starts_the_child_once_and_the_first_verdict_reuses_it(tmp_path: Path) -> None:
    path = tmp_path / "step-000007.pt"
    torch.save(small_state(7), path)
    w = WarmVerifier(nice=0)
    try:
        t0 = time.monotonic()
        assert w.warm() is True
        assert time.monotonic() - t0 < 5  # started, not waited for (its torch import runs meanwhile)
        pid = w.pid
        assert pid is not None and w.starts == 1
        assert w.warm() is False  # already running: nothing new
        rep = w.verify(path)
        assert rep.ok and rep.step == 7
        assert (w.starts, w.served, w.pid) == (1, 1, pid)  # the warm child answered, none started
    finally:
        w.close()
    assert w.pid is None


def _settings(tmp_path: Path, **options: object) -> tuple[RunSettings, Path]:
    run_dir = tmp_path / "run"
    opts = msgspec.structs.replace(LaunchOptions(), **options)
    return resolve(opts, Config(), cwd=str(tmp_path), run_dir=run_dir, env={}), run_dir


def test_checkpoints_are_expected_when_the_launch_says_so(tmp_path: Path) -> None:
    s, run_dir = _settings(tmp_path)
    assert expecting_checkpoints(s, run_dir) is None
    s, run_dir = _settings(tmp_path, watch_ckpt=["out"])
    assert expecting_checkpoints(s, run_dir) == "checkpoints are watched (out)"
    s, run_dir = _settings(tmp_path, ckpt_root=str(tmp_path / "ck"))
    why = expecting_checkpoints(s, run_dir)
    assert why == f"a checkpoint root is configured ({tmp_path / 'ck'})"
    s, run_dir = _settings(tmp_path, resume_template="python train.py --resume {ckpt}")
    assert expecting_checkpoints(s, run_dir) == "a resume template is set"
