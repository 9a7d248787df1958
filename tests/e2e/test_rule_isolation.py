"""Rule isolation on a real keeper: parts that raise (switched on by failpoints, or a frozen param
group at LR 0 that once raised ZeroDivisionError in the LR rule) are INTERNAL_ERROR findings with
their tracebacks journaled, and the watchdog still calls a SIGKILLed trainer DEAD."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import status
from tests.support.waiting import wait_for
from trainroom.core import failpoints
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

# A real torch model with two param groups, the backbone frozen at LR 0 (a common fine-tune).
FROZEN = """
    import time
    import torch
    from trainroom.core import sdk
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    opt = torch.optim.SGD([{"params": backbone.parameters(), "lr": 0.0}, {"params": head.parameters()}], lr=1e-3)
    rep = sdk.connect(lr=1e-3)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    step = 0
    while True:
        step += 1
        loss = torch.nn.functional.cross_entropy(head(torch.relu(backbone(x))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        rep.step(step, loss=float(loss), optimizer=opt, tokens=step * 64)
        print(f"iter {step}: loss {float(loss):.4f}", flush=True)
        time.sleep(0.05)
"""

BROKEN = (
    "sanity.loss",
    "watchdog.locks",
    "watchdog.duplicates",
    "probe.gpu",
    "log reader",
    "checkpoints.findings",
)


def _launch(tmp_path: Path) -> runs.RunInfo:
    script = tmp_path / "frozen.py"
    script.write_text(textwrap.dedent(FROZEN))
    return launch([sys.executable, str(script)], LaunchOptions(linger_s=120), cwd=str(tmp_path))


def _internal(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["key"]: f for f in d["findings"] if f["code"] == "INTERNAL_ERROR"}


def _kill_trainer(d: dict[str, Any]) -> None:
    os.kill(d["attempts"][-1]["pid"], signal.SIGKILL)


def test_parts_that_raise_are_internal_errors_and_a_killed_trainer_is_still_dead(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.ENV, ",".join(BROKEN))
    info = _launch(tmp_path)
    d = wait_for(
        lambda: (s := status(info))["step"] and set(_internal(s)) >= set(BROKEN) and s,
        timeout=90,
        what="an INTERNAL_ERROR per broken part",
    )
    assert d["state"] == "running"
    assert all(f["severity"] == "warning" for f in _internal(d).values())
    _kill_trainer(d)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=60, what="dead")
    assert "DEAD" in {f["code"] for f in d["findings"]}
    assert set(_internal(d)) >= set(BROKEN)
    notes = [
        r
        for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, p.KeeperNote) and r.kind == "internal-error"
    ]
    for name in BROKEN:
        (first, *_) = [n for n in notes if n.message.startswith(f"{name} raised")]
        assert "Traceback" in first.message and "InjectedFault" in first.message


def test_a_frozen_param_group_at_lr_zero_is_watched_like_any_run(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path)
    d = wait_for(lambda: (s := status(info))["step"] and s["step"] >= 30 and s, timeout=90, what="30 steps")
    codes = {f["code"] for f in d["findings"]}
    assert "INTERNAL_ERROR" not in codes and "LR_MISMATCH" not in codes, d["findings"]
    _kill_trainer(d)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=60, what="dead")
    assert "DEAD" in {f["code"] for f in d["findings"]}
    assert "INTERNAL_ERROR" not in {f["code"] for f in d["findings"]}
