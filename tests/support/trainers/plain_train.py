"""A hand-written PyTorch loop (a tiny linear model fit by SGD), printing its progress the ways
plain loops do, with no framework and no trainroom:

    --mode tqdm        a bare tqdm bar with a postfix: `45%|...| 45/60 [..., loss=2.3100, lr=0.05]`
    --mode tqdm-desc   one described bar per epoch (`epoch 1: ...`), the same postfix
    --mode tqdm-write  a bare bar with no postfix, and `tqdm.write("step 10 loss 2.3100")` lines
    --mode logging     `logging.info`: `INFO:root:step 10 loss 2.3100 lr 0.05`
    --mode logging-time a timestamped logging format: `2026-12-04 10:00:00,123 INFO train: step=10, loss=2.3100`
    --mode print       `print`: `Step 10/60 | Loss: 2.3100 | LR: 5.00e-02`
    --mode nothing     lines with no step and no loss, then it waits for --hold to exist
    --mode tqdm-sampled a bar redrawn every --show-every steps (tqdm's miniters), its postfix the
                       loss of a small minibatch: a healthy but noisy loss, seen at sampled steps;
                       --diverge-at N turns the optimizer to gradient ascent from step N (a real rise)

Each step's loss (as printed) goes to --record as JSON lines `{"step": n, "loss": x}`, the loop's
own record a test compares `status` with.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch


class Loop:
    """A tiny linear model fit by SGD; each step's loss (as printed) is recorded."""

    def __init__(self, record: str, delay: float, lr: float = 0.05, batch: int = 0) -> None:
        torch.manual_seed(0)
        self.x = torch.randn(256, 8)
        self.y = self.x @ torch.randn(8, 1) + (1.0 if batch else 0.1) * torch.randn(256, 1)
        self.batch = batch  # 0: the whole set each step; else a random minibatch of that size
        self.model = torch.nn.Linear(8, 1)
        self.lr = lr
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        self.record = open(record, "w")  # noqa: SIM115 (held for the whole loop)
        self.delay = delay

    def step(self, n: int) -> float:
        self.opt.zero_grad()
        x, y = self.x, self.y
        if self.batch:
            idx = torch.randint(0, len(x), (self.batch,))
            x, y = x[idx], y[idx]
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        value = float(f"{loss.item():.4f}")
        self.record.write(json.dumps({"step": n, "loss": value, "t": time.time()}) + "\n")
        self.record.flush()
        time.sleep(self.delay)
        return value


def bars(mode: str, loop: Loop, steps: int, every: int = 2, diverge_at: int = 0) -> None:
    from tqdm import tqdm

    if mode == "tqdm-sampled":
        bar = tqdm(range(1, steps + 1), mininterval=0, miniters=every)
        for n in bar:
            if n == diverge_at:
                loop.opt.param_groups[0]["maximize"] = True
            bar.set_postfix(loss=f"{loop.step(n):.4f}", refresh=False)
    elif mode == "tqdm":
        bar = tqdm(range(1, steps + 1))
        for n in bar:
            bar.set_postfix(loss=f"{loop.step(n):.4f}", lr=loop.lr)
    elif mode == "tqdm-desc":
        per = steps // 2
        for epoch in range(2):
            bar = tqdm(range(per), desc=f"epoch {epoch}")
            for i in bar:
                bar.set_postfix(loss=f"{loop.step(epoch * per + i + 1):.4f}", lr=loop.lr)
    else:
        for n in tqdm(range(1, steps + 1)):
            loss = loop.step(n)
            if n % 5 == 0:
                tqdm.write(f"step {n} loss {loss:.4f}")


def lines(mode: str, loop: Loop, steps: int) -> None:
    if mode == "logging":
        logging.basicConfig(level=logging.INFO)
        root = logging.getLogger()
        for n in range(1, steps + 1):
            root.info("step %d loss %.4f lr %g", n, loop.step(n), loop.lr)
    elif mode == "logging-time":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log = logging.getLogger("train")
        for n in range(1, steps + 1):
            log.info("step=%d, loss=%.4f", n, loop.step(n))
    elif mode == "print":
        for n in range(1, steps + 1):
            print(f"Step {n}/{steps} | Loss: {loop.step(n):.4f} | LR: {loop.lr:.2e}", flush=True)
    elif mode == "print-every-10":  # nanoGPT's habit: a line every log_interval steps
        for n in range(1, steps + 1):
            loss = loop.step(n)
            if n % 10 == 0:
                print(f"step {n} loss {loss:.4f}", flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--record", required=True)
    ap.add_argument("--hold", default="")
    ap.add_argument("--step-delay", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=0.05)  # 3e-5: tqdm's postfix shows `lr=3e-5`
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--show-every", type=int, default=2)
    ap.add_argument("--diverge-at", type=int, default=0)
    args = ap.parse_args()
    if args.mode == "nothing":
        for i in range(250):
            print(f"batch {i} processed in 0.01 s, queue depth {i % 7}", flush=True)
        while args.hold and not os.path.exists(args.hold):
            time.sleep(0.05)
        return 0
    loop = Loop(args.record, args.step_delay, args.lr, args.batch)
    if args.mode.startswith("tqdm"):
        bars(args.mode, loop, args.steps, args.show_every, args.diverge_at)
    else:
        lines(args.mode, loop, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
