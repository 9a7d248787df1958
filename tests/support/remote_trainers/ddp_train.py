"""A tiny DDP trainer for the job tests: gloo on CPU, one all-reduce per step (so a rank that
stops holds every other rank in the collective), the trainroom reporter on every rank.

    torchrun --nnodes=2 --nproc-per-node=1 --node-rank=I --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=JOB ddp_train.py [--steps N] [--step-delay S] [--bare]

--bare: no reporter; every rank prints nanoGPT's `iter N: loss X` lines instead (uninstrumented).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from trainroom.core import sdk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-delay", type=float, default=0.05)
    ap.add_argument("--bare", action="store_true", help="uninstrumented: log lines only")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rep = None if args.bare else sdk.connect(lr=0.01, vocab_size=4)
    print(f"rank {rank} of {dist.get_world_size()} pid {os.getpid()} up", flush=True)
    for step in range(1, args.steps + 1):
        x = torch.randn(32, 16)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # DDP's gradient all-reduce: every rank meets here each step
        opt.step()
        if rep is not None:
            rep.step(step, loss=loss.item(), tokens=step * 32, optimizer=opt)
        else:
            print(f"iter {step}: loss {loss.item():.4f}, time 1.00ms, mfu 0.01%", flush=True)
        time.sleep(args.step_delay)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
