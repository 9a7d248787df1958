"""A tiny PyTorch Lightning run, as a user would write it: a LightningModule (a small MLP language
model over random tokens), `ModelCheckpoint`, a `CSVLogger` (the framework's own record of the
logged metrics), the progress bar Lightning picks (Rich; `--tqdm` for TQDM). `--adapter` adds trainroom's one line.

    python lightning_train.py --out out --max-steps 100 --every 20 [--adapter] [--tqdm] [--ckpt-path P]
        [--accumulate_grad_batches N] [--iterable]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger


class Pace(L.Callback):
    """After the bar (drawn) and trainroom's callback: sleep, or stop at a global step."""

    def __init__(self, delay: float, stop_at: int, record: str | None = None) -> None:
        self.delay, self.stop_at = delay, stop_at
        self.record = open(record, "a") if record else None  # noqa: SIM115 (held for the run)

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if self.record is not None:  # each batch's end, with the optimizer steps so far: the true pace
            self.record.write(json.dumps({"step": trainer.global_step, "t": time.time()}) + "\n")
            self.record.flush()
        if self.stop_at and trainer.global_step == self.stop_at:  # 0: never (accumulating, step 0 lasts)
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(self.delay)


class Rows(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The same rows with no length: Lightning's bar cannot know its total (`175/?`)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.data)


class TinyLM(L.LightningModule):
    def __init__(self, vocab: int = 64, dim: int = 32, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self.head(torch.tanh(self.emb(x)))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=20, help="ModelCheckpoint every N steps")
    ap.add_argument("--batches", type=int, default=40, help="batches per epoch")
    ap.add_argument("--adapter", action="store_true")
    ap.add_argument("--tqdm", action="store_true")
    ap.add_argument("--step-delay", type=float, default=0.0)
    ap.add_argument("--stop-at", type=int, default=0, help="SIGSTOP itself after this global step")
    ap.add_argument("--ckpt-path", default=None)
    ap.add_argument("--accumulate_grad_batches", type=int, default=1, help="batches per optimizer step")
    ap.add_argument("--iterable", action="store_true", help="an IterableDataset: the bar's total is `?`")
    ap.add_argument("--record", default=None, help="each batch's end time and global step, JSON lines")
    args = ap.parse_args()
    torch.manual_seed(0)
    data = torch.randint(0, 64, (args.batches * 4, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(Rows(data) if args.iterable else data, batch_size=4)
    callbacks: list[L.Callback] = [
        ModelCheckpoint(
            dirpath=f"{args.out}/ckpt", every_n_train_steps=args.every, save_top_k=-1, save_last=True
        )
    ]
    # Lightning picks the Rich bar when rich is installed (it is, with trainroom): --tqdm asks for
    # the TQDM one, as a user without rich gets by default.
    if args.tqdm:
        from lightning.pytorch.callbacks import TQDMProgressBar

        callbacks.append(TQDMProgressBar())
    if args.adapter:
        from trainroom.integrations.lightning import TrainroomCallback

        callbacks.append(TrainroomCallback())
    if args.step_delay > 0 or args.stop_at > 0 or args.record:
        callbacks.append(Pace(args.step_delay, args.stop_at, args.record))
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(args.out, name="csv", version=0),
        log_every_n_steps=1,
        accumulate_grad_batches=args.accumulate_grad_batches,
        callbacks=callbacks,
        enable_model_summary=False,
    )
    trainer.fit(TinyLM(), loader, ckpt_path=args.ckpt_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
