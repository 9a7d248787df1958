"""Which parts of a faithful resume a checkpoint holds, read from what the verifier already
loaded: a torch.save dict's keys (nanoGPT's `optimizer`, `iter_num`, `config`; Lightning's
`optimizer_states`, `lr_schedulers`, `loops`, `hyper_parameters`), the files of a Hugging Face
`checkpoint-N/` and its `trainer_state.json`, the keys of a torch.distributed.checkpoint's
metadata. No file is read again and no code of the trainer runs: each function looks at keys,
lengths and a few scalars of an object already in memory, so it costs a verification next to
nothing (scripts/bench_completeness.py measures it).

Nothing here raises on an odd object: what cannot be told is left absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from trainroom.core.resumable import Completeness, Part, PartName

_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "model_state", "module", "net", "network")
_STEP_KEYS = ("iter_num", "global_step", "step", "iteration", "iter", "num_steps", "steps")
_CONFIG_KEYS = (
    "config",
    "model_args",
    "args",
    "hyper_parameters",
    "hparams",
    "cfg",
    "training_args",
    "model_config",
    "train_config",
)
_CODE_KEYS = ("git_sha", "git_commit", "git_hash", "git_rev", "commit", "code_revision", "revision", "git")
_DATA_KEYS = (
    "consumed_samples",
    "consumed_train_samples",
    "samples_seen",
    "batches_seen",
    "tokens",
    "tokens_seen",
    "num_input_tokens_seen",
    "batch_idx",
    "data_position",
    "data_state",
    "dataset_state",
)
# The RNG generators a state names, by the keys a trainer saves them under.
_GENERATORS = (("cuda", "cuda"), ("numpy", "numpy"), ("np_", "numpy"), ("python", "python"))
# Optimizer state slots and the optimizer family they belong to.
_SLOTS = (
    ("exp_avg", "Adam moments"),
    ("momentum_buffer", "SGD momentum"),
    ("square_avg", "RMSprop averages"),
    ("sum", "Adagrad sums"),
    ("exp_inf", "Adamax moments"),
)


def _is_tensor(v: object) -> bool:
    return hasattr(v, "shape") and hasattr(v, "numel")


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if _is_tensor(v):
        try:
            return int(v.item()) if v.numel() == 1 else None  # type: ignore[attr-defined]
        except (RuntimeError, ValueError, TypeError):
            return None
    return None


def _items(m: object) -> list[tuple[str, Any]]:
    if isinstance(m, Mapping):
        return [(str(k), v) for k, v in m.items()]
    return []


def _seq(v: object) -> list[Any]:
    """A list, or a DCP-nested one (a dict keyed "0", "1"...)."""
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, Mapping) and v and all(str(k).isdigit() for k in v):
        return [v[k] for k in sorted(v, key=lambda k: int(str(k)))]
    return []


# --------------------------------------------------------------------------- one part each


def is_optimizer_state(v: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(v, Mapping) and "state" in v and "param_groups" in v


def optimizer_seen(sd: Mapping[str, Any]) -> str:
    """'AdamW moments for 28 params' from an optimizer's state_dict (or DCP's nesting of one)."""
    state = sd.get("state")
    per_param = [v for _, v in _items(state)]
    slots: set[str] = set()
    for v in per_param[:4]:
        slots.update(str(k) for k in (v.keys() if isinstance(v, Mapping) else ()))
    kind = next((name for slot, name in _SLOTS if slot in slots), None)
    groups = _seq(sd.get("param_groups"))
    if kind == "Adam moments" and any(
        isinstance(g, Mapping) and g.get("decoupled_weight_decay") is True for g in groups
    ):
        kind = "AdamW moments"
    if not per_param:
        return f"state empty (no step taken yet), {len(groups)} param group(s)"
    what = kind or ("state " + ", ".join(sorted(slots)[:3]))
    return f"{what} for {len(per_param)} params"


def is_scheduler_state(v: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(v, Mapping) and ("last_epoch" in v or "base_lrs" in v or "_step_count" in v)


def scheduler_seen(sd: Mapping[str, Any]) -> str:
    at = _int(sd.get("last_epoch"))
    return f"at step {at}" if at is not None else "its state"


def is_scaler_state(v: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(v, Mapping) and "scale" in v and ("growth_factor" in v or "_growth_tracker" in v)


def scaler_seen(sd: Mapping[str, Any]) -> str:
    scale = sd.get("scale")
    try:
        return f"loss scale {float(scale):g}" if scale is not None else "its state"
    except (TypeError, ValueError, RuntimeError):
        return "its state"


def generators(keys: Iterable[str]) -> list[str]:
    """torch, cuda, numpy, python: the generators a state's RNG keys name."""
    found: list[str] = []
    for k in keys:
        low = k.lower()
        name = next((g for word, g in _GENERATORS if low.startswith(word) or f"_{word}" in low), "torch")
        if name not in found:
            found.append(name)
    order = ("torch", "cuda", "numpy", "python")
    return sorted(found, key=lambda g: order.index(g) if g in order else len(order))


def is_rng_state(v: object) -> TypeGuard[Mapping[str, Any]]:
    """HF's rng_state.pth: python, numpy and cpu (and cuda) states at the top level."""
    return isinstance(v, Mapping) and "python" in v and "cpu" in v


# --------------------------------------------------------------------------- a torch.save dict


def of_state(obj: object, *, model_key: str | None = None, framework: str | None = None) -> Completeness:
    """What one loaded training state holds. `model_key`: where its weights sit, as the
    inventory found it ("" for a bare state_dict); `framework`: as the verifier told it."""
    parts: dict[str, Part] = {}
    if not isinstance(obj, Mapping):
        present = _is_tensor(obj)
        parts["model"] = Part(present=present, seen="a lone tensor" if present else "")
        return _with_absent(parts)
    _model(parts, obj, model_key)
    for k, v in _items(obj):
        _by_key(parts, k, v)
    _alone(parts, obj)
    _step(parts, obj)
    if framework == "lightning":
        _lightning(parts, obj)
    elif framework == "nanogpt" and not parts.get("scheduler"):
        # nanoGPT's LR is a function of iter_num (get_lr): the step is the scheduler's state.
        it = _int(obj.get("iter_num"))
        parts["scheduler"] = Part(present=True, seen=f"computed from iter_num {it} (get_lr)")
    return _with_absent(parts)


def _by_key(parts: dict[str, Part], k: str, v: object) -> None:
    """The part a top-level key holds, by its name and its value's shape."""
    low = k.lower()
    if "optim" in low:
        _optimizer(parts, k, v)
    elif "sched" in low:
        _scheduler(parts, k, v)
    elif "scaler" in low or is_scaler_state(v):
        if isinstance(v, Mapping) and is_scaler_state(v):
            parts.setdefault("scaler", Part(present=True, seen=f"{k}: {scaler_seen(v)}"))
    elif "rng" in low or "random_state" in low:
        gens = generators([str(x) for x in v]) if isinstance(v, Mapping) else generators([low])
        _add(parts, "rng", f"{k}: " + ", ".join(gens))
    elif low in _DATA_KEYS or "sampler" in low or "loader" in low:
        n = _int(v)
        _add(parts, "data", f"{k} {n}" if n is not None else k)
    elif low in _CONFIG_KEYS:
        size = len(v) if isinstance(v, Mapping) else None
        _add(parts, "config", f"{k} ({size} entries)" if size is not None else k)
        _code_in(parts, v)
    elif low in _CODE_KEYS and isinstance(v, (str, bytes)):
        _add(parts, "code", f"{k} {str(v)[:12]}")


def _alone(parts: dict[str, Part], obj: Mapping[str, Any]) -> None:
    """A file that is one part alone (HF's optimizer.pt, scheduler.pt, scaler.pt, rng_state.pth)."""
    if is_optimizer_state(obj):
        parts["optimizer"] = Part(present=True, seen=optimizer_seen(obj))
    elif is_scheduler_state(obj):
        parts["scheduler"] = Part(present=True, seen=scheduler_seen(obj))
    elif is_scaler_state(obj):
        parts["scaler"] = Part(present=True, seen=scaler_seen(obj))
    elif is_rng_state(obj):
        parts["rng"] = Part(present=True, seen=", ".join(generators(str(k) for k in obj)))


def _add(parts: dict[str, Part], name: PartName, seen: str) -> None:
    was = parts.get(name)
    if was is not None and was.present:
        parts[name] = Part(present=True, seen=f"{was.seen}; {seen}" if seen not in was.seen else was.seen)
    else:
        parts[name] = Part(present=True, seen=seen)


def _model(parts: dict[str, Part], obj: Mapping[str, Any], model_key: str | None) -> None:
    if model_key is None:
        model_key = next((k for k in _MODEL_KEYS if isinstance(obj.get(k), Mapping)), None)
    if model_key is None:
        return
    weights = obj if model_key == "" else obj.get(model_key)
    n = sum(1 for v in weights.values() if _is_tensor(v) or v is None) if isinstance(weights, Mapping) else 0
    where = "a bare state_dict" if model_key == "" else f"'{model_key}'"
    parts["model"] = Part(present=True, seen=f"{n} tensors under {where}" if n else where)


def _optimizer(parts: dict[str, Part], key: str, v: object) -> None:
    states: list[Mapping[str, Any]] = (
        [v] if is_optimizer_state(v) else [x for x in _seq(v) if is_optimizer_state(x)]
    )
    if states:
        seen = "; ".join(optimizer_seen(s) for s in states[:2]) + (" …" if len(states) > 2 else "")
        _add(parts, "optimizer", f"{key}: {seen}")
    elif isinstance(v, Mapping) and v:
        _add(parts, "optimizer", f"{key} ({len(v)} entries)")


def _scheduler(parts: dict[str, Part], key: str, v: object) -> None:
    states: list[Mapping[str, Any]] = (
        [v] if is_scheduler_state(v) else [x for x in _seq(v) if is_scheduler_state(x)]
    )
    if states:
        more = f"{len(states)} schedulers, first " if len(states) > 1 else ""
        _add(parts, "scheduler", f"{key}: {more}{scheduler_seen(states[0])}")


def _code_in(parts: dict[str, Part], config: object) -> None:
    for k, v in _items(config):
        if k.lower() in _CODE_KEYS and isinstance(v, str) and v:
            _add(parts, "code", f"{k} {v[:12]}")
            return


def _step(parts: dict[str, Part], obj: Mapping[str, Any]) -> None:
    for k in _STEP_KEYS:
        if k in obj:
            n = _int(obj[k])
            _add(parts, "step", f"{k} {n}" if n is not None else k)
            return


def _lightning(parts: dict[str, Part], obj: Mapping[str, Any]) -> None:
    """Lightning's loops record the batches done; only a stateful loader's state (kept under the
    fit loop's `combined_loader`) lets a mid-epoch resume go on where it was."""
    fit = obj.get("loops", {}).get("fit_loop") if isinstance(obj.get("loops"), Mapping) else None
    if not isinstance(fit, Mapping):
        return
    done = fit.get("epoch_loop.batch_progress", {})
    total = done.get("total", {}) if isinstance(done, Mapping) else {}
    batches = _int(total.get("processed")) if isinstance(total, Mapping) else None
    epochs = fit.get("epoch_progress", {})
    ep_total = epochs.get("current", {}) if isinstance(epochs, Mapping) else {}
    epoch = _int(ep_total.get("completed")) if isinstance(ep_total, Mapping) else None
    where = f"loops: epoch {epoch}, {batches} batches processed"
    inner = fit.get("state_dict")
    if isinstance(inner, Mapping) and inner.get("combined_loader"):
        _add(parts, "data", f"{where}, the loader's state")
    elif not parts.get("data"):
        parts["data"] = Part(present=False, seen=f"{where}; the loader keeps no state")


def _with_absent(parts: dict[str, Part]) -> Completeness:
    """Every part but the loss scaler listed, absent where nothing was found."""
    out = dict(parts)
    for name in ("model", "optimizer", "scheduler", "rng", "data", "step", "config", "code"):
        out.setdefault(name, Part())
    return Completeness(parts=out)


# --------------------------------------------------------------------------- directories


def merged(found: Sequence[tuple[str, Completeness]]) -> dict[str, Part]:
    """The parts that files of one checkpoint hold, each named with the file(s) it was seen in."""
    out: dict[str, Part] = {}
    for name, c in found:
        for part, seen in c.parts.items():
            if not seen.present:
                continue
            was = out.get(part)
            text = f"{name}: {seen.seen}" if seen.seen else name
            if was is None:
                out[part] = Part(present=True, seen=text)
            elif was.seen.count(";") < 1:
                out[part] = Part(present=True, seen=f"{was.seen}; {text}")
            elif not was.seen.endswith("…"):
                out[part] = Part(present=True, seen=f"{was.seen} …")
    return out


def of_hf(files: Sequence[tuple[str, str, int, Completeness | None]], trainer_state: object) -> Completeness:
    """A Hugging Face `checkpoint-N/`: (name, role, tensors, what a loaded file holds) for each
    file, and its parsed trainer_state.json. The Trainer skips the batches already seen on a
    resume, counted from trainer_state.json, so that file is the data position."""
    loaded = [(n, c) for n, role, _, c in files if c is not None and role in ("optimizer", "metadata")]
    parts = {k: v for k, v in merged(loaded).items() if k in ("optimizer", "scheduler", "scaler", "rng")}
    weights = [(n, tensors) for n, role, tensors, _ in files if role == "model"]
    if weights:
        n = weights[0][0]
        more = f" and {len(weights) - 1} more file(s)" if len(weights) > 1 else ""
        parts["model"] = Part(present=True, seen=f"{n}{more}: {sum(x for _, x in weights)} tensors")
    names = {n for n, _, _, _ in files}
    if isinstance(trainer_state, Mapping):
        step = _int(trainer_state.get("global_step"))
        epoch = trainer_state.get("epoch")
        parts["step"] = Part(present=True, seen=f"trainer_state.json global_step {step}")
        ep = f"epoch {epoch:.4g}, " if isinstance(epoch, (int, float)) else ""
        parts["data"] = Part(
            present=True, seen=f"trainer_state.json: {ep}step {step} (the Trainer skips the batches seen)"
        )
    config = [n for n in ("config.json", "training_args.bin", "adapter_config.json") if n in names]
    if config:
        parts["config"] = Part(present=True, seen=", ".join(config))
    return _with_absent(parts)


def dcp_skeleton(md: Any) -> dict[str, Any]:
    """A DCP checkpoint's saved nesting from its metadata alone (every value None): what it holds
    can be told from the keys before (or without) a load."""
    paths = getattr(md, "planner_data", None) or {}
    out: dict[str, Any] = {}
    for fqn in getattr(md, "state_dict_metadata", {}) or {}:
        parts = [str(x) for x in paths.get(fqn, (fqn,))]
        node = out
        for k in parts[:-1]:
            nxt = node.setdefault(k, {})
            node = nxt if isinstance(nxt, dict) else {}
        node[parts[-1]] = None
    return out


def safely(read: Any, *args: Any, **kw: Any) -> Completeness | None:
    """A reader's answer, or None if the object surprised it: completeness never fails a verify."""
    try:
        out = read(*args, **kw)
    except Exception:  # an odd object leaves completeness unknown, never the verdict broken
        return None
    return out if isinstance(out, Completeness) else None
