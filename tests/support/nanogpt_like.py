"""An uninstrumented trainer shaped like nanoGPT's train.py, for the checkpoint-watch tests.

It imports nothing from trainroom: a GPT (wte/wpe, blocks of ln_1/attn/ln_2/mlp, ln_f, lm_head
tied to wte), AdamW, `iter N: loss X` log lines, and every --save-every iterations it overwrites
`out/ckpt.pt` in place with what nanoGPT saves (model, optimizer, model_args, iter_num,
best_val_loss, config). The one thing nanoGPT does not do: with --wait-copies it waits, before
training on, until the keeper's checkpoint root ($TRAINROOM_CKPT_ROOT) holds a verified copy of
each version so far, so a test never races the watcher's settle time on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d), "c_proj": nn.Linear(d, d)})
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d), "c_proj": nn.Linear(4 * d, d)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn["c_attn"](self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.attn["c_proj"](y)
        return x + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, n_layer: int, n_head: int, n_embd: int, block_size: int, vocab_size: int) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(block_size, n_embd),
                "h": nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
                "ln_f": nn.LayerNorm(n_embd),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer["wte"].weight = self.lm_head.weight  # tied, as in nanoGPT
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        tr = self.transformer
        x = tr["wte"](idx) + tr["wpe"](torch.arange(idx.shape[1]))
        for blk in tr["h"]:
            x = blk(x)
        return self.lm_head(tr["ln_f"](x))


def wait_for_copies(n: int, timeout_s: float) -> None:
    root = os.environ.get("TRAINROOM_CKPT_ROOT")
    if not root:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        verified = 0
        for manifest in Path(root).glob("step-*/manifest.json"):
            try:
                verified += bool(json.loads(manifest.read_text()).get("ok"))
            except (OSError, ValueError):
                pass
        if verified >= n:
            return
        time.sleep(0.1)
    print(f"no verified copy of version {n} after {timeout_s:.0f} s", flush=True)
    sys.exit(3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--wait-copies", action="store_true")
    ap.add_argument("--no-wait-last", action="store_true", help="with --wait-copies, not after the last save")
    # nanoGPT's own: where ckpt.pt lives, and `resume` to start from it.
    ap.add_argument("--out_dir", default="out")
    ap.add_argument("--init_from", default="scratch", choices=("scratch", "resume"))
    ap.add_argument("--die-at", type=int, default=None, help="SIGKILL itself after this iteration")
    ap.add_argument(
        "--drop-optimizer-from", type=int, default=None, help="save without the optimizer from this iteration"
    )
    ap.add_argument("--delay", type=float, default=0.0, help="seconds slept after each iteration")
    ap.add_argument("--log-interval", type=int, default=1, help="print every Nth iteration (nanoGPT's is 10)")
    ap.add_argument("--record", default=None, help="each iteration's end time, JSON lines: the true pace")
    ap.add_argument(
        "--no-flush", action="store_true", help="print as nanoGPT does: stdout to a file is block-buffered"
    )
    ap.add_argument("--nan-from", type=int, default=None, help="the loss turns NaN from this iteration on")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model_args = {
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "block_size": 16,
        "bias": True,
        "vocab_size": 65,
        "dropout": 0.0,
    }
    config = {
        "out_dir": "out",
        "learning_rate": 6e-4,
        "batch_size": 4,
        "max_iters": args.iters,
        "dataset": "shakespeare_char",
        "compile": False,
    }
    model = GPT(
        model_args["n_layer"],
        model_args["n_head"],
        model_args["n_embd"],
        model_args["block_size"],
        model_args["vocab_size"],
    )
    opt = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"], betas=(0.9, 0.95))
    out = Path(args.out_dir)
    out.mkdir(exist_ok=True)
    best_val_loss = torch.tensor(1e9)
    saves = 0
    start = 1
    if args.init_from == "resume":
        ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start = int(ckpt["iter_num"]) + 1
        print(f"resuming from {out / 'ckpt.pt'} at iter {ckpt['iter_num']}", flush=True)
    print(f"nanogpt-like: ln(V) {math.log(65):.4f}", flush=True)
    record = open(args.record, "a") if args.record else None  # noqa: SIM115 (held for the loop)
    t0 = time.time()
    for it in range(start, args.iters + 1):
        x = torch.randint(65, (4, 16))
        loss = F.cross_entropy(model(x).view(-1, 65), torch.roll(x, -1, 1).view(-1))
        if args.nan_from is not None and it >= args.nan_from:
            loss = loss * float("nan")  # what a diverged run's loss becomes
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # As nanoGPT times it: the wall time since the previous iteration's end (the sleep and the
        # save included), printed every log_interval iterations.
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if record is not None:
            record.write(json.dumps({"iter": it, "t": t1}) + "\n")
            record.flush()
        if it % args.log_interval == 0:
            line = f"iter {it}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu 0.01%"
            print(line, flush=not args.no_flush)
        if it % args.save_every == 0:
            best_val_loss = torch.minimum(best_val_loss, loss.detach())
            checkpoint = {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "model_args": model_args,
                "iter_num": it,
                "best_val_loss": best_val_loss,
                "config": config,
            }
            if args.drop_optimizer_from is not None and it >= args.drop_optimizer_from:
                del checkpoint["optimizer"]  # a save that keeps the weights only
            print(f"saving checkpoint to {out}", flush=True)
            torch.save(checkpoint, out / "ckpt.pt")  # in place, over the previous version
            saves += 1
            if args.wait_copies and not (args.no_wait_last and it + args.save_every > args.iters):
                wait_for_copies(saves, 120.0)
        if args.delay:
            time.sleep(args.delay)
        if it == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
