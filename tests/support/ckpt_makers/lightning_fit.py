"""A real Lightning `Trainer` fit: a tiny LightningModule (an MLP language model over random
tokens), SGD with a StepLR, `ModelCheckpoint` saving `step=N.ckpt` every --every steps (its
state carries `kth_value = tensor(inf)`, `best_model_score`). Imports nothing from trainroom.

    python lightning_fit.py --dirpath ckpts --max-steps 40 --every 10 [--die-at 30]
        [--ckpt_path ckpts/step=20.ckpt]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.nn import functional as F

VOCAB, CTX = 64, 8


class TinyLM(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Linear(32, VOCAB)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.head(self.embed(batch[:, :-1]))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 100, 0.1)},
        }


def loader(n: int = 4096, seed: int = 0) -> torch.utils.data.DataLoader[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(torch.randint(0, VOCAB, (n, CTX), generator=g), batch_size=8)


class DieAt(Callback):
    """SIGKILL after the step's checkpoint was written (ModelCheckpoint saves in the same hook)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *a: Any) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SayStart(Callback):
    """One line with the step training begins at (after a resume: the checkpoint's)."""

    def on_train_start(self, trainer: L.Trainer, *a: Any) -> None:
        print(f"train begins at step {trainer.global_step}", flush=True)


class WaitVerified(Callback):
    """After each save, wait until the test marked the keeper's verdict on it (tests only)."""

    def __init__(self, marker_dir: str, every: int) -> None:
        self.marker_dir, self.every = Path(marker_dir), every

    def on_train_batch_end(self, trainer: L.Trainer, *a: Any) -> None:
        if trainer.global_step % self.every:
            return
        want = self.marker_dir / f"step={trainer.global_step}.ckpt"
        deadline = time.monotonic() + 300
        while not want.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def make_trainer(
    dirpath: str,
    max_steps: int,
    every: int,
    extra: list[Callback] | None = None,
    weights_only: bool = False,
) -> L.Trainer:
    ckpt = ModelCheckpoint(
        dirpath=dirpath,
        filename="{step}",
        every_n_train_steps=every,
        save_top_k=-1,
        save_weights_only=weights_only,
    )
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        callbacks=[ckpt, *(extra or [])],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )


def fit(
    dirpath: str,
    max_steps: int = 2,
    every: int = 1,
    ckpt_path: str | None = None,
    weights_only: bool = False,
) -> L.Trainer:
    torch.manual_seed(0)
    trainer = make_trainer(dirpath, max_steps, every, weights_only=weights_only)
    trainer.fit(TinyLM(), loader(), ckpt_path=ckpt_path)
    return trainer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dirpath", default="ckpts")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--wait-verified", default=None)
    ap.add_argument("--ckpt_path", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    extra: list[Callback] = [SayStart()]
    if a.wait_verified:
        extra.append(WaitVerified(a.wait_verified, a.every))
    if a.die_at is not None and a.ckpt_path is None:
        extra.append(DieAt(a.die_at))
    trainer = make_trainer(a.dirpath, a.max_steps, a.every, extra)
    if a.ckpt_path:
        print(f"resuming from {a.ckpt_path}", flush=True)
    trainer.fit(TinyLM(), loader(), ckpt_path=a.ckpt_path)
    print(f"done at step {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
