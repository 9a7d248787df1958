"""What both adapters share: a reporter connected once per process, and hooks that never break
the training loop."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from trainroom.core.logs.logformats import number
from trainroom.core.sdk.reporter import NullReporter, Reporter, connect

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["AdapterBase", "guarded", "number"]


class AdapterBase:
    """The reporter (connected lazily, with the rank the framework knows) and the one warning
    an adapter may print when a hook of its fails."""

    def __init__(self) -> None:
        self._rep: Reporter | NullReporter | None = None
        self._warned = False
        self.failures = 0

    def reporter(
        self,
        rank: int | None = None,
        world_size: int | None = None,
        lr: float | None = None,
        vocab_size: int | None = None,
        warmup_steps: int | None = None,
    ) -> Reporter | NullReporter:
        if self._rep is None:
            self._rep = connect(
                lr=lr if lr is not None and lr > 0 else None,
                vocab_size=vocab_size if vocab_size is not None and vocab_size > 0 else None,
                warmup_steps=warmup_steps if warmup_steps is not None and warmup_steps >= 0 else None,
                rank=rank,
                world_size=world_size if world_size is not None and world_size >= 1 else None,
            )
        return self._rep

    @property
    def active(self) -> bool:
        return self._rep is not None and self._rep.active

    def _failed(self, hook: str, exc: BaseException) -> None:
        self.failures += 1
        if not self._warned and self.active:
            self._warned = True
            print(
                f"trainroom: {type(self).__name__}.{hook} failed ({type(exc).__name__}: {exc}); "
                "training goes on, this is said once",
                file=sys.stderr,
            )


def guarded(hook: F) -> F:
    """A hook that raises is counted (and said once, under a keeper), never raised into the
    trainer: telemetry must not stop a training run."""

    @functools.wraps(hook)
    def wrapper(self: AdapterBase, *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, *args, **kwargs)
        except Exception as exc:
            self._failed(hook.__name__, exc)
            return None

    return wrapper  # type: ignore[return-value]


def scalar(value: object) -> float | None:
    """A loss as a float: a number, a one-element tensor, or a string that spells one."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 0)() == 1:
        value = item()
    return number(value)
