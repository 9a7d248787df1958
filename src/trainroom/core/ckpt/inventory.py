"""What a loaded checkpoint holds: its tensors walked by name, NaN/Inf and the std of each in
bounded chunks, the exploded ones, and the architecture fingerprint (layers, d_model, vocab,
params) compared with the declared config, the file's own config and the previous checkpoint.

Torch is imported only inside the functions that look at tensors.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import msgspec

from trainroom.core.ckpt.report import Arch, ArchMismatch, NonFinite, Outlier
from trainroom.core.vocab import TensorRole

if TYPE_CHECKING:
    import torch

SCAN_CHUNK = 1 << 22  # elements per statistics chunk: bounds the float32 copies of bf16/fp16 data
# A weight matrix with a std above this is exploded (healthy ones sit in the tenths or below; the
# seed's "best" checkpoint had lm_head at 13.87 and a first loss of 96).
STD_EXPLODED = 5.0
# Flag (not reject) a matrix whose std is this many times the model's median matrix std.
STD_UNUSUAL_RATIO = 50.0
# Reject a tensor whose std grew this much since the previous verified checkpoint.
STD_GROWTH = 10.0

MODEL_KEYS = (
    "model",
    "state_dict",
    "model_state_dict",
    "model_state",
    "module",
    "net",
    "network",
    "weights",
    "params",
    "ema",
)
STEP_KEYS = ("iter_num", "step", "global_step", "iteration", "iter", "epoch")
_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)\.")
_EMBED_SUFFIXES = (
    "wte.weight",
    "embed_tokens.weight",
    "tok_embeddings.weight",
    "word_embeddings.weight",
    "token_embedding.weight",
    "tok_emb.weight",
    "embedding.weight",
    "embeddings.weight",
    "embed.weight",
)
_HEAD_SUFFIXES = ("lm_head.weight", "output.weight", "head.weight")
# Declared-config spellings (nanoGPT, Hugging Face, Llama) of the fingerprint's fields.
ARCH_ALIASES: dict[str, tuple[str, ...]] = {
    "layers": ("layers", "n_layer", "n_layers", "num_layers", "num_hidden_layers"),
    "d_model": ("d_model", "n_embd", "n_embed", "hidden_size", "dim"),
    "vocab": ("vocab", "vocab_size", "n_vocab"),
    "params": ("params", "n_params", "num_params"),
}


def sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


# --------------------------------------------------------------------------- walking


# The most entries (container items, tensors) one walk looks at: a loaded state is walked in time
# bounded by this whatever its shape; a state with more is cut short, and says so.
WALK_BUDGET = 20_000_000
WALK_DEPTH = 64


class Walker:
    """Every tensor in a loaded training state, by its dotted path, once per path through
    containers walked once each: a container reached again (a pickle's shared references, the
    "billion laughs" of nested lists of one list) is not walked again, and the walk stops after
    `budget` entries. A tensor under two names (tied weights) is still yielded under both.
    `cut_short` says why it stopped early (None when it saw everything); `shared` counts the
    containers met again and skipped."""

    def __init__(self, obj: object, prefix: str = "", budget: int = WALK_BUDGET) -> None:
        self._obj = obj
        self._prefix = prefix
        self.budget = budget
        self.entries = 0
        self.shared = 0
        self.cut_short: str | None = None
        self._run: Iterator[tuple[str, torch.Tensor]] | None = None

    def __iter__(self) -> Walker:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        if self._run is None:
            self._run = self._walk()
        return next(self._run)

    def _walk(self) -> Iterator[tuple[str, torch.Tensor]]:
        import torch

        seen: set[int] = set()
        # An explicit stack (depth-first, in order): no recursion limit, no frame per level.
        stack: list[tuple[str, object, int]] = [(self._prefix, self._obj, 0)]
        while stack:
            prefix, obj, depth = stack.pop()
            self.entries += 1
            if self.entries > self.budget:
                self.cut_short = (
                    f"walked {self.budget:,} entries and stopped: the state holds more objects than a "
                    "checkpoint's (a pickle of shared references?), so not every tensor was looked at"
                )
                return
            if isinstance(obj, torch.Tensor):
                yield prefix, obj
                continue
            if depth > WALK_DEPTH:
                continue
            if isinstance(obj, (Mapping, list, tuple)) or (
                hasattr(obj, "__dict__") and type(obj).__name__ == "Namespace"
            ):
                if id(obj) in seen:
                    self.shared += 1
                    continue
                seen.add(id(obj))
            room = max(0, self.budget - self.entries - len(stack)) + 1  # never more than the budget
            if isinstance(obj, Mapping):
                items: Iterator[tuple[object, object]] = iter(obj.items())
            elif isinstance(obj, (list, tuple)):
                items = enumerate(obj)
            elif hasattr(obj, "__dict__") and type(obj).__name__ == "Namespace":
                items = iter(vars(obj).items())
            else:
                continue
            kids = [(f"{prefix}.{k}" if prefix else str(k), v) for k, v in itertools.islice(items, room)]
            stack.extend((name, v, depth + 1) for name, v in reversed(kids))


def walk(obj: object, prefix: str, budget: int | None = None) -> Walker:
    """Every tensor in a loaded training state, by its dotted path (see Walker: bounded by
    identity and by work; `budget` entries, default WALK_BUDGET)."""
    return Walker(obj, prefix, WALK_BUDGET if budget is None else budget)


def model_prefix(obj: object) -> str | None:
    """Where the model's weights sit: the whole object (a bare state_dict), a well-known key
    (nanoGPT's "model"), or the largest dict of tensors not under an optimizer."""
    import torch

    def tensor_share(m: object) -> float:
        if not isinstance(m, Mapping) or not m:
            return 0.0
        return sum(isinstance(v, torch.Tensor) for v in m.values()) / len(m)

    if isinstance(obj, torch.Tensor):
        return ""
    if not isinstance(obj, Mapping):
        return None
    if tensor_share(obj) == 1.0:
        return ""
    for k in MODEL_KEYS:
        if k in obj and tensor_share(obj[k]) >= 0.5:
            return k
    best, best_n = None, 0
    for k, v in obj.items():
        if "optim" in str(k).lower() or not isinstance(v, Mapping):
            continue
        n = sum(t.numel() for t in v.values() if isinstance(t, torch.Tensor))
        if tensor_share(v) >= 0.5 and n > best_n:
            best, best_n = str(k), n
    return best


def _is_model_tensor(name: str, prefix: str | None) -> bool:
    if prefix is None:
        low = name.lower()
        return not any(w in low for w in ("optim", "scaler", "sched"))
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def _is_optimizer_tensor(name: str) -> bool:
    # nanoGPT's "optimizer", Lightning's "optimizer_states", DCP's "optim": by the top-level key.
    return "optim" in name.split(".", 1)[0].lower()


def _short_name(name: str, prefix: str | None) -> str:
    if prefix:
        name = name[len(prefix) + 1 :] if name.startswith(prefix + ".") else name
    for lead in ("_orig_mod.", "module."):
        while name.startswith(lead):
            name = name[len(lead) :]
    return name


def step_in_state(obj: object) -> tuple[int, str] | None:
    """(the step a training state records about itself, the key it is under): nanoGPT's
    iter_num, Lightning's global_step, a DCP state's step."""
    import torch

    if not isinstance(obj, Mapping):
        return None
    for k in STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v, k
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point():
            return int(v.item()), k
    return None


def in_file_config(obj: object) -> Mapping[str, object] | None:
    """The model config a training state carries beside its weights, if it names the architecture
    (nanoGPT keeps model_args; Lightning keeps hyper_parameters)."""
    if isinstance(obj, Mapping):
        for k in ("model_args", "model_config", "hyper_parameters", "config"):
            v = obj.get(k)
            if isinstance(v, Mapping) and normalize_arch(v):
                return v
    return None


# --------------------------------------------------------------------------- statistics


def tensor_stats(t: torch.Tensor, want_std: bool = True) -> tuple[int, int, float | None]:
    """(NaN count, Inf count, std over the finite values) in chunks: one fast float32 sum decides
    whether a chunk is finite; chunks merge with Chan's formula. A std that overflows even a
    double is the largest float (JSON has no infinity; it is exploded all the same)."""
    import torch

    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0, 0, None
    if t.is_complex():
        t = torch.view_as_real(t)
    flat = t.detach().reshape(-1)
    n_tot, mean, m2, nan, inf = 0, 0.0, 0.0, 0, 0
    for i in range(0, flat.numel(), SCAN_CHUNK):
        c = flat[i : i + SCAN_CHUNK]
        if c.dtype not in (torch.float32, torch.float64):
            c = c.float()
        s = float(c.sum())
        if not math.isfinite(s):
            fin = torch.isfinite(c)
            k = int(fin.sum())
            c_nan = int(torch.isnan(c).sum())
            nan += c_nan
            inf += c.numel() - k - c_nan
            if k == c.numel():  # finite but the float32 sum overflowed
                c = c.double()
            elif k == 0:
                continue
            else:
                c = c[fin].double()
            s = float(c.sum())
        if not want_std:
            continue
        n = c.numel()
        m = s / n
        # Fast path, no copy: M2 = sum(x^2) - n*mean^2. Exact enough while the mean is small
        # against the RMS (weight matrices); otherwise (LayerNorm gains near 1) subtract first.
        sq = float(torch.dot(c, c))
        q = sq - n * m * m
        if not math.isfinite(q) or n * m * m > 1e-3 * sq:
            d = c - m
            if not math.isfinite(sq):
                d = d.double()
            q = float(torch.dot(d, d))
        # Chan et al.: merge this chunk's (n, mean, M2) into the running one.
        delta = m - mean
        tot = n_tot + n
        mean += delta * n / tot
        m2 += q + delta * delta * n_tot * n / tot
        n_tot = tot
    if not want_std or n_tot == 0:
        return nan, inf, None
    std = math.sqrt(m2 / n_tot)
    return nan, inf, std if math.isfinite(std) else sys.float_info.max


class Inventory:
    """What the scan gathers, tensor by tensor."""

    def __init__(
        self, model_prefix: str | None, previous_stds: Mapping[str, float], role: TensorRole = "auto"
    ) -> None:
        self.model_prefix = model_prefix
        self.previous_stds = previous_stds
        self.role = role
        self.tensors = 0
        self.dtypes: dict[str, int] = {}
        # Non-finite values in weights or optimizer state (a rejection), and in anything else
        # (Lightning's ModelCheckpoint keeps kth_value = inf; reported only).
        self.nonfinite: dict[str, NonFinite] = {}
        self.nonfinite_metadata: dict[str, NonFinite] = {}
        self.stds: dict[str, float] = {}
        self.ndims: dict[str, int] = {}
        self.shapes: dict[str, list[int]] = {}
        self.params = 0
        self._storages: set[tuple[int, int, tuple[int, ...]]] = set()

    def kind(self, name: str) -> TensorRole:
        """model, optimizer or metadata: what a non-finite value in this tensor means."""
        if self.role != "auto":
            return self.role
        if _is_model_tensor(name, self.model_prefix):
            return "model"
        return "optimizer" if _is_optimizer_tensor(name) else "metadata"

    def add(self, name: str, t: torch.Tensor) -> None:
        self.tensors += 1
        dt = str(t.dtype).removeprefix("torch.")
        self.dtypes[dt] = self.dtypes.get(dt, 0) + 1
        kind = self.kind(name)
        model = kind == "model"
        nan, inf, std = tensor_stats(t, want_std=model)
        if nan or inf:
            into = self.nonfinite if kind in ("model", "optimizer") else self.nonfinite_metadata
            into[name] = NonFinite(nan=nan, inf=inf)
        if not model:
            return
        short = _short_name(name, self.model_prefix)
        self.shapes[short] = list(t.shape)
        self.ndims[short] = t.dim()
        if std is not None:
            self.stds[short] = std
        # Tied weights (nanoGPT's wte and lm_head) share one storage: count them once.
        try:
            ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        except RuntimeError:
            ident = (id(t), 0, tuple(t.shape))
        if ident not in self._storages:
            self._storages.add(ident)
            self.params += t.numel()

    def merge(self, other: Inventory) -> None:
        """Another file's weights into these (a sharded model: the architecture is the union)."""
        self.shapes.update(other.shapes)
        self.ndims.update(other.ndims)
        self.stds.update(other.stds)
        self.params += other.params

    def outliers(self) -> list[Outlier]:
        """Exploded and unusual weight tensors, the widest first."""
        mats = [s for n, s in self.stds.items() if self.ndims.get(n, 0) >= 2]
        median = statistics.median(mats) if mats else None
        out: list[Outlier] = []
        for name, std in self.stds.items():
            prev = self.previous_stds.get(name)
            matrix = self.ndims.get(name, 0) >= 2
            if matrix and std > STD_EXPLODED:
                kind, why = "exploded", f"std {std:.2f} > {STD_EXPLODED:g}"
            elif prev is not None and prev > 0 and std > STD_GROWTH * prev and std > 0.5:
                kind = "exploded"
                why = f"std {std:.3g} grew {std / prev:.0f}x since the previous checkpoint ({prev:.3g})"
            elif median and matrix and std > STD_UNUSUAL_RATIO * median and std > 1.0:
                kind, why = "unusual", f"std {std:.3g} is {std / median:.0f}x the median"
            else:
                continue
            out.append(
                Outlier(
                    name=name,
                    std=sig(std, 4),
                    median_std=None if median is None else sig(median, 4),
                    previous_std=None if prev is None else sig(float(prev), 4),
                    kind="exploded" if kind == "exploded" else "unusual",
                    why=why,
                )
            )
        out.sort(key=lambda o: -o.std)
        return out

    def arch(self) -> Arch:
        layers = {m.group(1) for n in self.shapes for m in [_LAYER_RE.search(n)] if m}
        embed = next(
            (n for n in self.shapes if n.endswith(_EMBED_SUFFIXES) and len(self.shapes[n]) == 2), None
        )
        head = next((n for n in self.shapes if n.endswith(_HEAD_SUFFIXES) and len(self.shapes[n]) == 2), None)
        src = embed or head
        return Arch(
            layers=len(layers) if layers else None,
            vocab=self.shapes[src][0] if src else None,
            d_model=self.shapes[src][1] if src else None,
            params=self.params,
            embedding=embed,
            lm_head=head,
        )


# --------------------------------------------------------------------------- the fingerprint


def normalize_arch(cfg: Mapping[str, object] | None) -> dict[str, int]:
    """A declared config (any spelling in ARCH_ALIASES) as {layers, d_model, vocab, params}."""
    out: dict[str, int] = {}
    if not cfg:
        return out
    for field, names in ARCH_ALIASES.items():
        for n in names:
            v = cfg.get(n)
            if isinstance(v, bool) or v is None:
                continue
            if isinstance(v, (int, float)) and float(v).is_integer():
                out[field] = int(v)
                break
    return out


def _vocab_padded(declared: int, found: int) -> bool:
    # nanoGPT pads GPT-2's 50257 to 50304 (a multiple of 64) for efficiency.
    return any(found == -(-declared // m) * m for m in (8, 64, 128, 256)) and found > declared


def compare_arch(found: Arch, expected: Mapping[str, object] | Arch, against: str) -> list[ArchMismatch]:
    """Where the fingerprint differs from a config (any spelling) or a previous fingerprint; a
    padded vocab (nanoGPT's 50304 for 50257) is no difference from a config."""
    exp = normalize_arch(msgspec.structs.asdict(expected) if isinstance(expected, Arch) else expected)
    out: list[ArchMismatch] = []
    for field, want in exp.items():
        got = getattr(found, field)
        if got is None or got == want:
            continue
        if field == "vocab" and against != "previous" and _vocab_padded(want, int(got)):
            continue
        out.append(ArchMismatch(field=field, expected=want, found=int(got), against=against))
    return out
