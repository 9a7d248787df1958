"""The requested configuration of an attempt: what argv parsing guessed, merged with what the
trainer itself says."""

from __future__ import annotations

from trainroom.core.wire import protocol as p


def merge_requested(base: p.RequestedConfig, new: p.RequestedConfig) -> p.RequestedConfig:
    """The trainer's own word wins over what argv parsing guessed, field by field."""
    return p.RequestedConfig(
        lr=new.lr if new.lr is not None else base.lr,
        vocab_size=new.vocab_size if new.vocab_size is not None else base.vocab_size,
        warmup_steps=new.warmup_steps if new.warmup_steps is not None else base.warmup_steps,
        arch=new.arch or base.arch,
    )
