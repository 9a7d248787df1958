"""A tiny PyTorch Lightning run as a user writes it for DDP on CPU: `Trainer(strategy="ddp",
devices=N, accelerator="cpu")`. Lightning's own launcher makes the ranks: the launched process is
rank 0 and it re-runs this script for each other rank with LOCAL_RANK, NODE_RANK and WORLD_SIZE in
its environment (no RANK). The progress bar is Lightning's default (Rich where rich is installed).

    python lightning_ddp.py --out out [--devices 2] [--max-steps 0] [--warmup 50] [--adapter]

--warmup N: a linear LR warm-up (LinearLR from 1e-3 of the LR) over N scheduler steps, stepped
each optimizer step or, with --interval epoch (Lightning's default), each epoch of --batches;
--accumulate K: accumulate_grad_batches=K. Each rank prints its pid once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lightning as L
import torch
import torch.nn.functional as F


class Pace(L.Callback):
    """Sleeps after each batch; at the start of training, each rank writes OUT/rank<R>.up."""

    def __init__(self, delay: float, out: str) -> None:
        self.delay, self.out = delay, out

    def on_train_start(self, trainer: L.Trainer, *args: object) -> None:
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.up"), "w") as f:
            f.write(str(os.getpid()))

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        time.sleep(self.delay)


class TinyLM(L.LightningModule):
    def __init__(self, lr: float, warmup: int, interval: str, vocab: int = 64, dim: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def on_train_start(self) -> None:
        print(f"rank {self.global_rank} of {self.trainer.world_size} pid {os.getpid()}", flush=True)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self.head(torch.tanh(self.emb(x)))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> object:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        if not self.hparams.warmup:
            return opt
        sched = torch.optim.lr_scheduler.LinearLR(
            opt, start_factor=1e-3, end_factor=1.0, total_iters=self.hparams.warmup
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.hparams.interval}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=0, help="0: until stopped")
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--interval", choices=["step", "epoch"], default="step", help="the warm-up's")
    ap.add_argument("--batches", type=int, default=1000, help="batches per epoch")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--step-delay", type=float, default=0.05)
    ap.add_argument("--adapter", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.randint(
        0, 64, (args.batches * 4 * args.devices, 17), generator=torch.Generator().manual_seed(0)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    callbacks: list[L.Callback] = [Pace(args.step_delay, args.out)]
    if args.adapter:
        from trainroom.integrations.lightning import TrainroomCallback

        callbacks.append(TrainroomCallback())
    trainer = L.Trainer(
        max_steps=args.max_steps or -1,
        max_epochs=-1 if not args.max_steps else None,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        accumulate_grad_batches=args.accumulate,
        logger=False,
        enable_checkpointing=False,
        callbacks=callbacks,
        enable_model_summary=False,
    )
    trainer.fit(TinyLM(args.lr, args.warmup, args.interval), loader)
    return 0


if __name__ == "__main__":
    sys.exit(main())
