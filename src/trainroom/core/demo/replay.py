"""The demo trainer's side of `trainroom replay`: load the checkpoint before the step, train the
steps between on their own batches (each found again from its identity), then compute the loss of
the replayed step's batch and print it (`replay_loss=...`). The model, the optimizer and the
scheduler are restored as saved (no LR re-imposed: the replay follows the run as it was), on one
thread, so a replay of a batch gives the loss the run saw, to the bit, when the data is the cause."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from trainroom.core.demo.evaluate import checkpoint_file
from trainroom.core.sdk import ReplayRequest, replay_result


class Replayable(Protocol):
    """What a replay uses of the demo trainer (train.DemoRun)."""

    model: Any
    net: Any
    opt: Any
    sched: Any
    step: int
    tokens: int
    vocab: int
    batch_seed: int

    def batch_at(self, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def _before_step(self) -> None: ...
    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> Any: ...


def replay(run: Replayable, req: ReplayRequest) -> int:
    if not req.ckpt:
        print("replay: no checkpoint given (TRAINROOM_RESUME)", flush=True)
        return 2
    state = torch.load(checkpoint_file(req.ckpt), map_location="cpu", weights_only=True)
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    run.step, run.tokens = int(state["step"]), int(state.get("tokens", 0))
    print(f"replay: from {req.ckpt} at step {run.step} to step {req.step}", flush=True)
    while run.step + 1 < req.step:
        ref = req.batches.get(run.step + 1)
        seed = ref.seed if ref is not None and ref.seed is not None else run.batch_seed
        index = ref.index if ref is not None and ref.index is not None else run.step + 1
        x, y = run.batch_at(seed, index)
        run._before_step()
        run._train_step(x, y)
    seed = req.batch.seed if req.batch.seed is not None else run.batch_seed
    index = req.batch.index if req.batch.index is not None else req.step
    x, y = run.batch_at(seed, index)
    if req.fp32:
        print("replay: fp32 asked; the demo trains in fp32 already", flush=True)
    with torch.no_grad():
        logits = run.net(x)
        loss = F.cross_entropy(logits.view(-1, run.vocab), y.view(-1))
    replay_result(float(loss))
    return 0
