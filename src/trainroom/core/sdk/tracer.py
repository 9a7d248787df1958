"""Name the first module whose output went non-finite (scenario 7), opt-in from the trainer.

NaN and Inf spread through a forward pass within one step, so the module where the loss shows
NaN is usually far downstream of the cause. Forward hooks fire as each module returns, inner
modules before the containers that call them: the first hook that sees a non-finite output is
the module that produced it.

Cost: one `aminmax` per floating output, kept on the device (no sync per module), and one small
sync per forward of the root model to read them. Off (`enabled = False`, or after
`remove()`) there are no hooks at all. Hooks break torch.compile graphs: trace an eager model.

    from trainroom.core.sdk import NonFiniteTracer
    tracer = NonFiniteTracer(model)          # or: with NonFiniteTracer(model) as tracer: ...
    ...
    tracer.step = step                       # optional: the step number the note carries
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from trainroom.core.sdk import reporter as reporter_mod
from trainroom.core.sdk.lr import NoteSink

if TYPE_CHECKING:
    import torch
    from torch.utils.hooks import RemovableHandle

log = logging.getLogger(__name__)

INPUT = "<input>"  # reported when the batch itself reached the model non-finite
MAX_DEPTH = 4  # how deep outputs nested in tuples / lists / dicts are searched
MAX_PENDING = 65536  # flags held before an early check (submodules called outside the root)


def _tensors(obj: object, tm: ModuleType, depth: int = 0) -> Iterator[torch.Tensor]:
    """The floating tensors in a module's output, however it nests them (`tm`: torch itself)."""
    if isinstance(obj, tm.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield obj
        return
    if depth >= MAX_DEPTH:
        return
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o, tm, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, tm, depth + 1)
    elif hasattr(obj, "__dataclass_fields__"):  # HF ModelOutput and friends
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name, None), tm, depth + 1)


class NonFiniteTracer:
    """Forward hooks on every module of `model`; after each forward of `model` it checks, in
    execution order, which module's output first went non-finite. On the first forward that goes
    non-finite (and again after a clean forward) it logs and sends one
    `note("nonfinite-module", ..., step=self.step, module=name)` through `reporter` (or
    `trainroom.core.sdk.current()` when None)."""

    def __init__(
        self, model: torch.nn.Module, reporter: NoteSink | None = None, enabled: bool = True
    ) -> None:
        import torch

        self._torch: ModuleType = torch
        self.model = model
        self.reporter = reporter
        self.step: int | None = None
        self.first: tuple[int | None, str] | None = None  # (step, module) of the latest report
        self.reports = 0
        self._names: list[str] = []
        self._flags: list[torch.Tensor] = []
        self._flag_names: list[int] = []
        self._armed = True  # report the next non-finite forward
        self._handles: list[RemovableHandle] = []
        if enabled:
            self._install()

    # ------------------------------------------------------------------ switch

    @property
    def enabled(self) -> bool:
        return bool(self._handles)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        if on and not self._handles:
            self._install()
        elif not on:
            self.remove()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._flags.clear()
        self._flag_names.clear()

    def __enter__(self) -> NonFiniteTracer:
        if not self._handles:
            self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ------------------------------------------------------------------ hooks

    def _install(self) -> None:
        self._names = []
        for idx, (name, module) in enumerate(self.model.named_modules()):
            self._names.append(name or type(module).__name__)
            if module is self.model:
                continue
            self._handles.append(module.register_forward_hook(self._make_hook(idx)))
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre))
        self._handles.append(self.model.register_forward_hook(self._root_post))

    def _make_hook(self, idx: int) -> Callable[[torch.nn.Module, object, object], None]:
        def hook(_module: torch.nn.Module, _inputs: object, output: object) -> None:
            self._flag(idx, output)

        return hook

    def _flag(self, idx: int, obj: object) -> None:
        # min and max of each output, left on the device: NaN propagates through both and an Inf
        # shows in one, so their finiteness is the tensor's; one reduction, no sync, no copy.
        tm = self._torch
        ts: Iterable[torch.Tensor]
        if isinstance(obj, tm.Tensor):
            ts = (obj,) if obj.is_floating_point() or obj.is_complex() else ()
        else:
            ts = _tensors(obj, tm)
        flags, names = self._flags, self._flag_names
        for t in ts:
            if t.numel() == 0:
                continue
            t = t.detach()
            lo, hi = tm.aminmax(t.abs() if t.is_complex() else t)
            flags += (lo, hi)
            names += (idx, idx)
        if len(flags) >= MAX_PENDING:
            self.check()

    def _root_pre(self, _module: torch.nn.Module, inputs: object) -> None:
        self._flags.clear()
        self._flag_names.clear()
        self._flag(-1, inputs)

    def _root_post(self, _module: torch.nn.Module, _inputs: object, output: object) -> None:
        self._flag(0, output)
        self.check()

    # ------------------------------------------------------------------ the check

    def check(self) -> str | None:
        """Read the flags of the forward just finished (one sync); report and return the first
        non-finite module's qualified name, or None."""
        if not self._flags:
            return None
        torch = self._torch
        flags, names = self._flags, self._flag_names
        self._flags, self._flag_names = [], []
        try:
            # stack promotes fp16/bf16 to fp32 (and keeps fp64), so no finite value turns Inf.
            bad = (~torch.isfinite(torch.stack(flags))).nonzero()
            first = int(bad[0, 0].item()) if bad.numel() else None
        except RuntimeError:  # flags on several devices (a model split across GPUs)
            first = next((i for i, f in enumerate(flags) if not bool(torch.isfinite(f))), None)
        if first is None:
            self._armed = True
            return None
        idx = names[first]
        name = INPUT if idx < 0 else self._names[idx]
        if self._armed:
            self._armed = False
            self._report(name)
        return name

    def _report(self, name: str) -> None:
        self.first = (self.step, name)
        self.reports += 1
        at = f" at step {self.step}" if self.step is not None else ""
        what = "the input batch" if name == INPUT else f"module {name}"
        message = f"first non-finite output{at}: {what}"
        log.warning("trainroom: %s", message)
        rep = self.reporter if self.reporter is not None else reporter_mod.current()
        rep.note("nonfinite-module", message, step=self.step, module=name)
