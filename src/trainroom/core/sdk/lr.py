"""The LR a session asked for, and the SDK helper that makes a resumed run obey it (scenario 4).

A checkpoint carries progress, not policy. `optimizer.load_state_dict` brings back each group's
`lr` and `initial_lr` from the run that saved it, and `scheduler.load_state_dict` brings back
`base_lrs` (and `_last_lr`): a session launched with `--lr 1e-4` on a checkpoint of a run that
began at 1e-6 then trains at 1e-6, then 1e-7 at the next StepLR milestone, and nothing says so.
`reimpose_lr` puts the session's LR back into every place it lives, keeping the scheduler's
position (`last_epoch`), and reports what it changed.

The keeper imports this module for `requested_from_argv`, so torch is imported only inside
`reimpose_lr`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat, TypeAlias

import msgspec

from trainroom.core.wire.protocol import RequestedConfig

if TYPE_CHECKING:
    import torch

    # Anything with an LR schedule torch knows (ReduceLROnPlateau is its own kind).
    Scheduler: TypeAlias = torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau

# One of an optimizer's param_groups, as torch types it (lr, betas, params, ... by name).
ParamGroup: TypeAlias = dict[str, Any]

log = logging.getLogger(__name__)

LR_FLAGS = ("--lr", "--learning_rate", "--learning-rate")
VOCAB_FLAGS = ("--vocab-size", "--vocab_size")
WARMUP_FLAGS = ("--warmup-steps", "--warmup_steps", "--warmup-iters", "--warmup_iters")


# ============================================================== argv of an uninstrumented trainer


def requested_from_argv(argv: Sequence[str]) -> RequestedConfig:
    """The LR, vocab size and warmup the command line asked for (`--x v` and `--x=v`; the last
    occurrence wins). A value that does not parse is left unknown: this argv belongs to the
    trainer, it is not ours to reject."""
    raw: dict[str, str] = {}
    flags = (
        dict.fromkeys(LR_FLAGS, "lr")
        | dict.fromkeys(VOCAB_FLAGS, "vocab")
        | dict.fromkeys(WARMUP_FLAGS, "warmup")
    )
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        key = flags.get(name)
        if key is not None:
            if eq:
                raw[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                raw[key] = argv[i + 1]
                i += 1
        i += 1
    return RequestedConfig(
        lr=_positive_float(raw.get("lr")),
        vocab_size=_int_at_least(raw.get("vocab"), 2),
        warmup_steps=_int_at_least(raw.get("warmup"), 0),
    )


def _positive_float(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def _int_at_least(s: str | None, low: int) -> int | None:
    if s is None:
        return None
    try:
        v = int(s)
    except ValueError:
        try:
            f = float(s)  # "5e4"
        except ValueError:
            return None
        if not f.is_integer():
            return None
        v = int(f)
    return v if v >= low else None


# ============================================================== reimpose_lr


class LrChange(msgspec.Struct, kw_only=True):
    """One value `reimpose_lr` replaced: where it lives, what it was, what it is now."""

    field: str  # "param_groups[0].lr", "scheduler.base_lrs[0]", ...
    old: float | None
    new: float


class NoteSink(Protocol):
    def note(self, kind: str, message: str = "", step: int | None = None, **data: object) -> None: ...


# Schedulers whose get_lr() is a function of base_lrs and the position only (not of the current
# group lr), so it recomputes the right value at the restored position.
_POSITIONAL = ("LambdaLR", "OneCycleLR", "CyclicLR", "CosineAnnealingWarmRestarts")


def reimpose_lr(
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler | None,
    lr: float | Sequence[float],
    reporter: NoteSink | None = None,
    *,
    step: int | None = None,
) -> list[LrChange]:
    """After loading optimizer and scheduler state, make the session's `lr` the one in force.

    `lr` is one value for every param group or one per group; it is what the session's own
    schedule starts from (its base LR; for OneCycleLR and CyclicLR, the peak `max_lr`).

    Sets each group's `initial_lr` and the scheduler's `base_lrs` to it, then the current `lr`
    (and the scheduler's `_last_lr`) to what the session's schedule gives at the restored position
    `last_epoch`:
      - closed-form schedulers (StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR,
        ConstantLR, PolynomialLR): their `_get_closed_form_lr()` at `last_epoch`;
      - LambdaLR, OneCycleLR, CyclicLR, CosineAnnealingWarmRestarts: their `get_lr()`, which
        depends on base values and position only;
      - anything else (MultiplicativeLR, ChainedScheduler, custom ones): the restored LR scaled by
        new base / old base, which keeps the schedule's multiplier at this position;
      - SequentialLR: every child is rebased, the active child gives the current LR;
      - ReduceLROnPlateau (no base): the current LR becomes `lr`; its `min_lrs` stay.
    OneCycleLR keeps `max_lr`, `initial_lr` and `min_lr` per group: all three are scaled by
    new max / old max (so div_factor and final_div_factor hold); CyclicLR's `max_lrs` become `lr`
    and its `base_lrs` scale by the same ratio. Absolute floors (`eta_min`, `min_lrs`) and the
    schedule's shape (step_size, gamma, T_max, milestones, total_steps), which
    `scheduler.load_state_dict` also restored, are left as loaded.

    Returns every value that changed; sends one "lr-reimposed" note to the keeper (through
    `reporter`, or `trainroom.core.sdk.current()` when None) and logs it.
    """
    import torch

    groups = optimizer.param_groups
    targets = _per_group(lr, len(groups))
    changes: list[LrChange] = []
    old_lrs = [float(g["lr"]) for g in groups]

    if scheduler is None:
        for i, g in enumerate(groups):
            _set_group(g, "lr", targets[i], f"param_groups[{i}].lr", changes, torch)
            _set_group(g, "initial_lr", targets[i], f"param_groups[{i}].initial_lr", changes, torch)
    else:
        ratios = _rebase(scheduler, groups, targets, "scheduler", changes, torch)
        current = _current_lrs(scheduler, old_lrs, targets, ratios, torch)
        for i, g in enumerate(groups):
            _set_group(g, "lr", current[i], f"param_groups[{i}].lr", changes, torch)
        _set_last_lr(scheduler, current, "scheduler", changes)

    new_lrs = [float(g["lr"]) for g in groups]
    _announce(scheduler, targets, old_lrs, new_lrs, changes, reporter, step)
    return changes


def _per_group(lr: float | Sequence[float], n: int) -> list[float]:
    values = [float(lr)] * n if isinstance(lr, (int, float)) else [float(v) for v in lr]
    if len(values) != n:
        raise ValueError(f"reimpose_lr: {len(values)} learning rates for {n} param groups")
    for v in values:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"reimpose_lr: learning rate {v} is not a positive finite number")
    return values


def _val(v: object) -> float | None:
    """A number, a one-element tensor (a capturable optimizer's lr), or None."""
    if not isinstance(v, SupportsFloat):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _record(changes: list[LrChange], field: str, old: object, new: float) -> None:
    o = _val(old)
    if o is None or not math.isclose(o, new, rel_tol=1e-12, abs_tol=0.0):
        changes.append(LrChange(field=field, old=o, new=new))


def _set_group(
    g: ParamGroup, key: str, new: float, field: str, changes: list[LrChange], torch: ModuleType
) -> None:
    old = g.get(key)
    _record(changes, field, old, new)
    if isinstance(old, torch.Tensor):
        old.fill_(new)  # a tensor lr (capturable / fused optimizers) must keep its identity
    else:
        g[key] = new


def _set_list(
    obj: object, attr: str, i: int, new: float, field: str, changes: list[LrChange], torch: ModuleType
) -> None:
    values = getattr(obj, attr)
    old = values[i]
    _record(changes, f"{field}.{attr}[{i}]", old, new)
    if isinstance(old, torch.Tensor):
        old.fill_(new)
    else:
        values[i] = new


def _rebase(
    sched: Scheduler,
    groups: list[ParamGroup],
    targets: list[float],
    field: str,
    changes: list[LrChange],
    torch: ModuleType,
) -> list[float | None]:
    """Move the scheduler's base values (and the groups' initial/max/min lr) to `targets`.
    Returns per group the factor new/old of the schedule's reference LR (None when unknown)."""
    kind = type(sched).__name__
    children = getattr(sched, "_schedulers", None)
    if isinstance(children, list) and children:
        ratios: list[float | None] = [None] * len(groups)
        for k, child in enumerate(children):
            child_ratios = _rebase(child, groups, targets, f"{field}._schedulers[{k}]", changes, torch)
            ratios = [a if a is not None else b for a, b in zip(ratios, child_ratios, strict=True)]
        return ratios
    ratios = []
    for i, g in enumerate(groups):
        new = targets[i]
        if kind == "OneCycleLR":
            old_ref = _val(g.get("max_lr"))
            r = new / old_ref if old_ref else None
            _set_group(g, "max_lr", new, f"param_groups[{i}].max_lr", changes, torch)
            if r is not None:
                init = (_val(g.get("initial_lr")) or 0.0) * r
                _set_group(g, "initial_lr", init, f"param_groups[{i}].initial_lr", changes, torch)
                _set_group(
                    g,
                    "min_lr",
                    (_val(g.get("min_lr")) or 0.0) * r,
                    f"param_groups[{i}].min_lr",
                    changes,
                    torch,
                )
                if hasattr(sched, "base_lrs") and i < len(sched.base_lrs):
                    _set_list(sched, "base_lrs", i, init, field, changes, torch)
        elif kind == "CyclicLR":
            old_ref = _val(sched.max_lrs[i])
            r = new / old_ref if old_ref else None
            _set_list(sched, "max_lrs", i, new, field, changes, torch)
            if r is not None:
                base = (_val(sched.base_lrs[i]) or 0.0) * r
                _set_list(sched, "base_lrs", i, base, field, changes, torch)
                _set_group(g, "initial_lr", base, f"param_groups[{i}].initial_lr", changes, torch)
        elif hasattr(sched, "base_lrs") and i < len(sched.base_lrs):
            old_ref = _val(sched.base_lrs[i])
            r = new / old_ref if old_ref else None
            _set_list(sched, "base_lrs", i, new, field, changes, torch)
            _set_group(g, "initial_lr", new, f"param_groups[{i}].initial_lr", changes, torch)
        else:  # ReduceLROnPlateau and anything without a base
            r = None
            _set_group(g, "initial_lr", new, f"param_groups[{i}].initial_lr", changes, torch)
        ratios.append(r)
    return ratios


def _current_lrs(
    sched: Scheduler,
    old_lrs: list[float],
    targets: list[float],
    ratios: list[float | None],
    torch: ModuleType,
) -> list[float]:
    """The LR the session's schedule gives at the restored position."""
    children = getattr(sched, "_schedulers", None)
    if isinstance(children, list) and children and type(sched).__name__ == "SequentialLR":
        import bisect

        idx = bisect.bisect_right(sched._milestones, sched.last_epoch)
        return _current_lrs(children[min(idx, len(children) - 1)], old_lrs, targets, ratios, torch)
    kind = type(sched).__name__
    values: list[object] | None = None
    try:
        if hasattr(sched, "_get_closed_form_lr") and not children:
            values = list(sched._get_closed_form_lr())
        elif kind in _POSITIONAL:
            # get_lr() warns unless called from step(); this is the flag step() sets around it.
            prev = getattr(sched, "_get_lr_called_within_step", False)
            sched._get_lr_called_within_step = True
            try:
                values = list(sched.get_lr())
            finally:
                sched._get_lr_called_within_step = prev
    except (ValueError, ZeroDivisionError, IndexError, AttributeError, TypeError):
        values = None  # e.g. OneCycleLR past total_steps: fall back to scaling
    if values is not None and len(values) == len(old_lrs):
        out = [_val(v) for v in values]
        if all(v is not None and math.isfinite(v) for v in out):
            return [float(v) for v in out if v is not None]
    return [old * r if r is not None else t for old, r, t in zip(old_lrs, ratios, targets, strict=True)]


def _set_last_lr(sched: Scheduler, current: list[float], field: str, changes: list[LrChange]) -> None:
    last = getattr(sched, "_last_lr", None)
    if isinstance(last, list) and len(last) == len(current):
        for i, v in enumerate(current):
            _record(changes, f"{field}._last_lr[{i}]", last[i], v)
        sched._last_lr = list(current)
    children = getattr(sched, "_schedulers", None)
    if isinstance(children, list):
        for k, child in enumerate(children):
            _set_last_lr(child, current, f"{field}._schedulers[{k}]", changes)


def _announce(
    sched: Scheduler | None,
    targets: list[float],
    old_lrs: list[float],
    new_lrs: list[float],
    changes: list[LrChange],
    reporter: NoteSink | None,
    step: int | None,
) -> None:
    kind = type(sched).__name__ if sched is not None else None
    epoch = getattr(sched, "last_epoch", None) if sched is not None else None
    where = f"{kind} at last_epoch {epoch}" if kind else "no scheduler"
    if len(set(old_lrs)) == 1 and len(set(new_lrs)) == 1:
        lrs = f"{old_lrs[0]:.3g} -> {new_lrs[0]:.3g}"
    else:
        lrs = ", ".join(
            f"group {i} {o:.3g} -> {n:.3g}" for i, (o, n) in enumerate(zip(old_lrs, new_lrs, strict=True))
        )
    if changes:
        message = (
            f"LR re-imposed after loading state: {lrs} (requested {', '.join(f'{t:.3g}' for t in sorted(set(targets)))}; "
            f"{where}; {len(changes)} values changed)"
        )
        log.warning("trainroom: %s", message)
    else:
        message = f"LR already as requested: {lrs} ({where})"
        log.info("trainroom: %s", message)
    if reporter is None:
        try:
            from trainroom.core.sdk import reporter as reporter_mod
        except ImportError:
            return
        reporter = reporter_mod.current()
    reporter.note(
        "lr-reimposed",
        message,
        step=step,
        requested=targets,
        scheduler=kind,
        last_epoch=epoch if isinstance(epoch, int) else None,
        groups=[
            {"group": i, "old": o, "new": n} for i, (o, n) in enumerate(zip(old_lrs, new_lrs, strict=True))
        ],
        changes=[{"field": c.field, "old": c.old, "new": c.new} for c in changes],
    )
