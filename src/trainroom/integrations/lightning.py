"""PyTorch Lightning adapter: one line, `callbacks=[TrainroomCallback()]`.

- every optimizer step (`on_train_batch_end` of the batch that stepped: under
  `accumulate_grad_batches=N` once per N batches): the global step, the loss from that batch's
  outputs (multiplied back by N: Lightning divides it for the backward pass, and logs it
  undivided), the effective LR of each param group of the trainer's first optimizer, and the
  gradient norm taken just before the optimizer step (`grad_norm=False` skips that pass);
- every checkpoint a `ModelCheckpoint` saved (its `last_model_path`, `best_model_path` and kept
  top-k, once the file is on disk): a checkpoint candidate at the global step it was saved at;
- each epoch's start: an `epoch` note;
- at the start, the LR warm-up its scheduler makes, as `warmup_steps` (a scheduler that starts
  below its base LR is warming up, not a mismatch);
- when the keeper asks for a checkpoint now (`sdk.checkpoint_requested()`: a Slurm job's warning
  signal), at the next optimizer step's batch end: `trainer.save_checkpoint` into the quarantine
  of the run's checkpoint root, reported as a candidate (the keeper verifies and promotes it, then
  requeues the job from it) with a `checkpoint-saved` note that answers the request. Under DDP the
  ranks agree first (any rank asked: every rank saves, the call is collective; rank 0 writes).

One reporter per process with the trainer's `global_rank`, so under DDP each rank reports; only
rank 0 reports checkpoints. Outside a keeper (no TRAINROOM_SOCKET) nothing is sent or printed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

from trainroom.integrations._checkpoint_request import asked, save_asked
from trainroom.integrations._common import AdapterBase, guarded, scalar

__all__ = ["TrainroomCallback"]


def _first_lr(trainer: Any) -> float | None:
    opts = getattr(trainer, "optimizers", None) or []
    if not opts or not opts[0].param_groups:
        return None
    group = opts[0].param_groups[0]
    return float(group.get("initial_lr", group["lr"]))


def _warmup_steps(trainer: Any) -> int | None:
    """The optimizer steps of the LR warm-up the first scheduler makes, where it starts below its
    base LR (a warm-up) and says how long it lasts (`total_iters`: LinearLR, ConstantLR). With
    Lightning's default interval, "epoch", each of its iterations is an epoch of optimizer steps.
    None where it is no warm-up or its length is not told (the LR rule then waits while the LR
    rises)."""
    configs = getattr(trainer, "lr_scheduler_configs", None) or []
    opts = getattr(trainer, "optimizers", None) or []
    if not configs or not opts or not opts[0].param_groups:
        return None
    group = opts[0].param_groups[0]
    base = group.get("initial_lr")
    iters = getattr(configs[0].scheduler, "total_iters", None)
    if base is None or not group["lr"] < base or not isinstance(iters, int) or iters <= 0:
        return None
    if getattr(configs[0], "interval", "epoch") == "step":
        return iters * max(1, int(getattr(configs[0], "frequency", 1) or 1))
    batches = getattr(trainer, "num_training_batches", None)
    accumulate = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    if not isinstance(batches, int) or batches <= 0:
        return None  # an iterable without a length: epochs of unknown size
    return iters * max(1, batches // accumulate)


def _loss(outputs: Any) -> float | None:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return scalar(outputs) if outputs is not None else None


class TrainroomCallback(Callback, AdapterBase):
    def __init__(self, grad_norm: bool = True) -> None:
        Callback.__init__(self)
        AdapterBase.__init__(self)
        self.grad_norm = grad_norm
        self._norm: float | None = None
        self._saving_step: int | None = None
        self._seen: dict[str, int] = {}  # checkpoint path -> mtime_ns when reported
        self._stepped: int | None = None  # the global step last reported

    def _connect(self, trainer: Any, pl_module: Any) -> None:
        hparams = getattr(pl_module, "hparams", {}) or {}
        vocab = hparams.get("vocab_size") if hasattr(hparams, "get") else None
        self.reporter(
            rank=int(trainer.global_rank),
            world_size=int(trainer.world_size),
            lr=_first_lr(trainer),
            vocab_size=vocab if isinstance(vocab, int) else None,
            warmup_steps=_warmup_steps(trainer),
        )

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._connect(trainer, pl_module)
        self._stepped = int(trainer.global_step)
        # A resumed ModelCheckpoint already names the files of the run it resumed: not ours to report.
        for path in self._checkpoint_paths(trainer):
            with contextlib.suppress(OSError):
                self._seen[path] = os.stat(path).st_mtime_ns

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.active:
            self.reporter().note("epoch", step=int(trainer.global_step), epoch=int(trainer.current_epoch))

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if not (self.active and self.grad_norm):
            return
        import torch

        norms = [p.grad.detach().norm(2) for p in pl_module.parameters() if p.grad is not None]
        self._norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else None

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._report_checkpoints(trainer)  # ModelCheckpoint saved after this callback's batch end

    @guarded
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, accumulate = (
            int(trainer.global_step),
            max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1)),
        )
        if accumulate > 1 and step == self._stepped:
            return  # a micro-batch: the optimizer has not stepped yet
        self._stepped = step
        if self.active:
            loss = _loss(outputs)
            opts = trainer.optimizers
            self.reporter().step(
                step,
                loss=loss * accumulate if loss is not None else None,
                grad_norm=self._norm,
                optimizer=opts[0] if opts else None,
                batch=_batch(trainer, batch_idx),
            )
            self._norm = None
        if asked(trainer):
            save_asked(trainer, step, self.reporter() if self.active else None)

    @guarded
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step", trainer.global_step)
        self._saving_step = int(step)

    @guarded
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._report_checkpoints(trainer)

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._report_checkpoints(trainer)

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._report_checkpoints(trainer)

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._report_checkpoints(trainer)

    def _report_checkpoints(self, trainer: Any) -> None:
        """Each file a ModelCheckpoint wrote since the last look (a rewritten last.ckpt again)."""
        if not self.active or self._saving_step is None or not trainer.is_global_zero:
            return
        for path in self._checkpoint_paths(trainer):
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue  # not on disk (yet, or pruned by save_top_k)
            if self._seen.get(path) == mtime:
                continue
            self._seen[path] = mtime
            self.reporter().checkpoint(os.path.abspath(path), self._saving_step)

    @staticmethod
    def _checkpoint_paths(trainer: Any) -> list[str]:
        paths: set[str] = set()
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint):
                paths |= {cb.last_model_path, cb.best_model_path, *cb.best_k_models}
        return sorted(p for p in paths if p)


def _batch(trainer: Any, batch_idx: int) -> dict[str, int]:
    """The step's batch as the loop finds it again: the epoch, the batch's index in it, and the
    seed `seed_everything` set (PL_GLOBAL_SEED), where there is one."""
    out = {"epoch": int(trainer.current_epoch), "index": int(batch_idx)}
    seed = os.environ.get("PL_GLOBAL_SEED", "")
    if seed.lstrip("-").isdigit():
        out["seed"] = int(seed)
    return out
