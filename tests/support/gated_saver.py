"""A trainer that saves through the SDK only when the test says so, for the checkpoint-safety
tests: it connects, then for each step in --steps waits for `<gate>/save-<step>` to appear, saves
a small model with `save_checkpoint` (a refusal is printed, not raised) and marks
`<gate>/saved-<step>`. It ends when `<gate>/end` appears (exit 0), or at once after the saves
with --die (SIGKILL, a death a resume follows). A resumed attempt (TRAINROOM_RESUME set) prints
where it resumes from and ends."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch

from trainroom.core.sdk import reporter
from trainroom.core.sdk.save import save_checkpoint


def _wait(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gate", required=True)
    ap.add_argument("--steps", default="10")
    ap.add_argument("--die", action="store_true")
    a = ap.parse_args()
    gate = Path(a.gate)
    rep = reporter.connect(lr=1e-3)
    resume = os.environ.get("TRAINROOM_RESUME")
    if resume:
        print(f"resumed from {resume}", flush=True)
        return 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32))
    for step in (int(x) for x in a.steps.split(",")):
        _wait(gate / f"save-{step}")
        rep.step(step, loss=1.0 / step)
        try:
            saved = save_checkpoint({"model": model.state_dict(), "step": step}, step)
            print(f"saved step {step}: {saved.path}", flush=True)
        except Exception as exc:  # the test reads the refusal from the log
            print(f"save of step {step} refused: {type(exc).__name__}: {exc}", flush=True)
        (gate / f"saved-{step}").touch()
    if a.die:
        os.kill(os.getpid(), signal.SIGKILL)
    _wait(gate / "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
