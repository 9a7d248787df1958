"""A trainer that never reads `sdk.replay_request()`: started again by `trainroom replay` it trains
from scratch and saves every `--every` steps into the checkpoint root its own command line names
(`--root`), the way a script with a hard-coded output directory does. Step `--spike` trains on a
poisoned batch (its loss jumps), so the keeper records the batch window replay needs. Each step
names its batch (`index`). `--own FILE` also writes the model there itself at each save (plain
`torch.save`, no trainroom), the way a script with its own output file does. `--hold` holds only
the run under its keeper (a replay, started away from the keeper, trains on)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from trainroom.core.sdk import reporter
from trainroom.core.sdk.save import save_checkpoint


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--spike", type=int, default=25)
    ap.add_argument("--hold", help="after the spike, wait for this file to exist (a run still training)")
    ap.add_argument("--own", help="a file (relative to the cwd) the trainer writes itself at each save")
    a = ap.parse_args()
    hold = a.hold if os.environ.get("TRAINROOM_RUN") else None
    rep = reporter.connect(lr=0.05)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    for step in range(1, a.steps + 1):
        loss = 1.0 + 0.001 * (step % 3) + (40.0 if step == a.spike else 0.0)
        rep.step(step, loss=loss, batch={"index": step, "seed": 0})
        print(f"step {step} loss {loss:.4f}", flush=True)
        if step % a.every == 0:
            saved = save_checkpoint({"model": model.state_dict(), "step": step}, step, root=a.root)
            print(f"saved step {step}: {saved.file or saved.path}", flush=True)
            if a.own:
                os.makedirs(os.path.dirname(a.own) or ".", exist_ok=True)
                torch.save({"model": model.state_dict(), "step": step, "pid": os.getpid()}, a.own)
        time.sleep(0.02)
        while hold and step > a.spike and not os.path.exists(hold):
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
