"""A tiny Hugging Face `Trainer` run, as a user would write it: `HfArgumentParser` over
`TrainingArguments`, a `GPT2LMHeadModel` built from a tiny `GPT2Config`, random tokens, nothing
downloaded, `report_to=[]`. `--adapter` adds trainroom's one line (the callback).

    python hf_train.py --output_dir out --max_steps 100 --logging_steps 5 --save_steps 20 [--adapter]
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


@dataclasses.dataclass
class Extra:
    adapter: bool = False  # add trainroom.integrations.hf.TrainroomCallback
    samples: int = 256
    seq_len: int = 16
    vocab: int = 64
    step_delay: float = 0.0  # seconds slept after each step
    stop_at: int = 0  # SIGSTOP itself once this global step is done (and drawn): a test then kills it
    fail_after: int = 0  # the dataset raises KeyError('boom') after this many samples (in its worker)
    record: str = ""  # each optimizer step's end time, JSON lines: the true pace a test compares with


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq_len: int, vocab: int, fail_after: int = 0) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)
        self.fail_after, self.served = fail_after, 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.served += 1
        if self.fail_after and self.served > self.fail_after:
            raise KeyError("boom")  # a missing column, say: in the DataLoader's worker process
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):  # type: ignore[misc]
    """After the Trainer's own callbacks (the bar is drawn) and trainroom's: sleep, or stop."""

    def __init__(self, delay: float, stop_at: int, record: str = "") -> None:
        self.delay, self.stop_at = delay, stop_at
        self.record = open(record, "a") if record else None  # noqa: SIM115 (held for the run)

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        if self.record is not None:
            self.record.write(
                json.dumps({"step": getattr(state, "global_step", -1), "t": time.time()}) + "\n"
            )
            self.record.flush()
        if getattr(state, "global_step", -1) == self.stop_at:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(self.delay)


def main() -> int:
    parser = HfArgumentParser((TrainingArguments, Extra))
    args, extra = parser.parse_args_into_dataclasses()
    args.report_to = []
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=extra.vocab, n_positions=extra.seq_len, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    callbacks = []
    if extra.adapter:
        from trainroom.integrations.hf import TrainroomCallback

        callbacks.append(TrainroomCallback())
    if extra.step_delay > 0 or extra.stop_at > 0 or extra.record:
        callbacks.append(Pace(extra.step_delay, extra.stop_at, extra.record))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(extra.samples, extra.seq_len, extra.vocab, extra.fail_after),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
