"""A real Hugging Face `Trainer` run: a tiny GPT2LMHeadModel built from a config (nothing is
downloaded), random tokens, AdamW with a linear schedule, `checkpoint-N/` directories every
--save-steps. Imports nothing from trainroom (an uninstrumented trainer).

    python hf_trainer.py --output-dir out --max-steps 40 --save-steps 20 [--die-at 30]
        [--resume_from_checkpoint out/checkpoint-20]

--die-at N SIGKILLs itself at step N (after the step's save, if any); --wait-verified makes it
wait after each save until the keeper's watch journaled a verdict (a file the test names), so a
test never races the watcher's settle time on a loaded machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

VOCAB, CTX = 64, 16


def tiny_model(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg)


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 512, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, VOCAB, (n, CTX), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


class DieAt(TrainerCallback):
    """SIGKILL at a step, after that step's save: a death the keeper must see as such."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step == self.step and self.step % args.save_steps != 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class SayStart(TrainerCallback):
    """One line with the step training begins at (after a resume: the checkpoint's)."""

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        print(f"train begins at step {state.global_step}", flush=True)


class WaitVerified(TrainerCallback):
    """After each save, wait until the keeper's verdict on it is in the journal (tests only)."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = Path(marker_dir)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        want = self.marker_dir / f"checkpoint-{state.global_step}"
        deadline = time.monotonic() + 300
        while not want.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def training_args(output_dir: str, max_steps: int, save_steps: int, **kw: Any) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        save_steps=save_steps,
        logging_steps=5,
        per_device_train_batch_size=4,
        learning_rate=5e-4,
        warmup_steps=2,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        save_total_limit=None,
        seed=0,
        disable_tqdm=True,
        **kw,
    )


def make_trainer(output_dir: str, max_steps: int = 4, save_steps: int = 2, **kw: Any) -> Trainer:
    return Trainer(
        model=tiny_model(),
        args=training_args(output_dir, max_steps, save_steps, **kw),
        train_dataset=RandomTokens(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", default="out")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--die-at", type=int, default=None)
    ap.add_argument("--wait-verified", default=None, help="a directory where the test marks verdicts")
    ap.add_argument("--resume_from_checkpoint", default=None)
    a = ap.parse_args(argv)
    trainer = make_trainer(a.output_dir, a.max_steps, a.save_steps)
    trainer.add_callback(SayStart())
    if a.wait_verified:
        trainer.add_callback(WaitVerified(a.wait_verified))
    if a.die_at is not None and a.resume_from_checkpoint is None:
        trainer.add_callback(DieAt(a.die_at))
    if a.resume_from_checkpoint:
        print(f"resuming from {a.resume_from_checkpoint}", flush=True)
    # "True": the Trainer picks the newest checkpoint-N/ in its output_dir itself.
    resume: str | bool | None = True if a.resume_from_checkpoint == "True" else a.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=resume)
    print(f"done at step {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
