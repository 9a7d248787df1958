"""Hugging Face `Trainer` adapter: one line, `callbacks=[TrainroomCallback()]`.

- every optimizer step (`on_step_end`): the global step and the LR of each param group that step
  used (read at `on_optimizer_step`, before the scheduler steps: what the Trainer logs as its
  `learning_rate`), so a step's records all carry one LR;
- every log (`on_log`): the loss, grad norm and that same LR, at the same global step
  (the Trainer's `loss` is the mean over the logging window, as in `trainer_state.json`);
- every save (`on_save`): the `checkpoint-N/` directory as a checkpoint candidate, its step read
  from the `trainer_state.json` inside (the keeper verifies it before a resume may use it);
- each epoch's start: an `epoch` note.

One reporter per process, with the Trainer's own rank (`args.process_index`), so under DDP each
rank reports. Outside a keeper (no TRAINROOM_SOCKET) nothing is sent and nothing is printed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformers import TrainerCallback

from trainroom.core.sdk.requests import checkpoint_requested
from trainroom.integrations._common import AdapterBase, guarded, number

__all__ = ["TrainroomCallback"]


def checkpoint_step(ckpt_dir: str, default: int) -> int:
    """`global_step` from the checkpoint's trainer_state.json (what a resume restarts from)."""
    try:
        with open(os.path.join(ckpt_dir, "trainer_state.json"), "rb") as f:
            step = json.loads(f.read(1 << 22)).get("global_step")
    except (OSError, ValueError, AttributeError):
        return default
    return step if isinstance(step, int) and step >= 0 else default


class TrainroomCallback(TrainerCallback, AdapterBase):
    def __init__(self) -> None:
        AdapterBase.__init__(self)
        self._optimizer: Any = None
        self._lrs: list[float] | None = None  # the LRs the last optimizer step used

    def _connect(self, args: Any, state: Any, model: Any) -> None:
        max_steps = int(getattr(state, "max_steps", 0) or 0)
        get_warmup = getattr(args, "get_warmup_steps", None)
        warmup = get_warmup(max_steps) if callable(get_warmup) and max_steps > 0 else None
        config = getattr(model, "config", None)
        self.reporter(
            rank=int(getattr(args, "process_index", 0)),
            world_size=int(getattr(args, "world_size", 1)),
            lr=float(args.learning_rate),
            vocab_size=getattr(config, "vocab_size", None),
            warmup_steps=int(warmup) if warmup is not None else None,
        )

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._connect(args, state, kwargs.get("model"))
        self._optimizer = kwargs.get("optimizer")

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.active:
            epoch = number(state.epoch)
            self.reporter().note("epoch", step=int(state.global_step), epoch=round(epoch or 0.0, 4))

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        opt = kwargs.get("optimizer") or self._optimizer
        self._lrs = [float(g["lr"]) for g in opt.param_groups] if opt is not None else None

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control is not None and checkpoint_requested():
            # The keeper asks (a Slurm job's warning signal): the Trainer saves at this step, the
            # keeper verifies it, then requeues the job from it. Every rank sees the request.
            control.should_save = True
        if not self.active:
            return
        self._optimizer = kwargs.get("optimizer") or self._optimizer
        self.reporter().step(
            int(state.global_step), optimizer=self._optimizer, lr=self._lrs, batch=_batch(args, state)
        )

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if not self.active or not isinstance(logs, dict):
            return
        loss = number(logs.get("loss"))
        if loss is None:
            return  # eval metrics and the end-of-training summary are not a training step
        self.reporter().step(
            int(state.global_step),
            loss=loss,
            grad_norm=number(logs.get("grad_norm")),
            optimizer=self._optimizer,
            lr=self._lrs,
            batch=_batch(args, state),
        )

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.active or not getattr(state, "is_world_process_zero", True):
            return  # rank 0 writes the checkpoint; the others only wait for it
        ckpt_dir = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(ckpt_dir):
            self.reporter().checkpoint(
                os.path.abspath(ckpt_dir), checkpoint_step(ckpt_dir, int(state.global_step))
            )


def _batch(args: Any, state: Any) -> dict[str, int]:
    """The step's batch as the Trainer's own sampler finds it again: the epoch, the optimizer
    step, and the seed its sampler shuffles with (`data_seed`, else `seed`)."""
    seed = getattr(args, "data_seed", None)
    seed = getattr(args, "seed", None) if seed is None else seed
    out = {"epoch": int(number(state.epoch) or 0), "index": int(state.global_step)}
    if isinstance(seed, int):
        out["seed"] = seed
    return out
