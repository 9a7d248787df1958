"""A small DDP trainer for the torchrun tests: a nanoGPT-shaped model on random tokens, gloo on
CPU, one process per rank under `torchrun --nproc_per_node=N`.

Rank 0 prints nanoGPT's `iter N: loss X` lines (what the keeper's log reader recognises without
the SDK). With --sdk every rank reports through `trainroom.core.sdk` (one reporter per rank,
rank and world size from torchrun's environment), and rank 0 saves a checkpoint when the keeper
asks for one (`sdk.checkpoint_requested()`); TRAINROOM_RESUME set, every rank resumes from it.
--steps 0 trains until stopped; --step-delay keeps it slow enough to be watched on a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 65


class TinyLM(nn.Module):
    def __init__(self, d: int = 32, block: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(block, d)
        self.mlp = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        return self.lm_head(x + self.mlp(x))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=0, help="0: until stopped")
    ap.add_argument("--step-delay", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--sdk", action="store_true", help="report through trainroom's SDK on every rank")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    model = nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rep = None
    if args.sdk:
        from trainroom.core import sdk

        rep = sdk.connect(lr=args.lr, vocab_size=VOCAB, warmup_steps=0)
    print(f"rank {rank} of {dist.get_world_size()}: pid {os.getpid()}", flush=True)
    step = 0
    resume = os.environ.get("TRAINROOM_RESUME")
    if resume:  # a resumed attempt (a requeued Slurm job): every rank loads the same checkpoint
        saved = torch.load(resume, weights_only=True)
        model.module.load_state_dict(saved["model"])
        step = int(saved["step"])
        print(f"rank {rank} resumed from step {step} ({resume})", flush=True)
    while args.steps == 0 or step < args.steps:
        if rep is not None:
            from trainroom.core import sdk

            if sdk.checkpoint_requested(every_s=0.2) and rank == 0:
                sdk.save_checkpoint({"model": model.module.state_dict(), "step": step}, step)
                print(f"rank 0 saved a checkpoint at step {step} (asked by the keeper)", flush=True)
        step += 1
        x = torch.randint(VOCAB, (4, 16))
        loss = F.cross_entropy(model(x).view(-1, VOCAB), torch.roll(x, -1, 1).view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the gradient all-reduce: every rank waits for the others here
        opt.step()
        if rep is not None:
            rep.step(step, loss=loss.item(), optimizer=opt)
        if rank == 0:
            print(f"iter {step}: loss {loss.item():.4f}, time 1.00ms, mfu 0.01%", flush=True)
        if args.step_delay:
            time.sleep(args.step_delay)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
