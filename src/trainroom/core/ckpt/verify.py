"""The checkpoint verifier: what makes a written checkpoint a good one, or says why it is not.

    python -m trainroom.core.verify PATH [--json] [--expect-json JSON]     (exit 0 ok, 1 rejected, 2 bad input)

Checks, in order: size and digest against what was recorded at save time (one flipped byte in
tensor data loads without any error: only the digest catches it), the load itself
(`torch.load(weights_only=True, mmap=True, map_location="cpu")`, or safetensors) with its error
translated and unwrapped to the innermost cause, a tensor inventory, NaN/Inf per tensor, per-tensor
std with exploded tensors flagged (the seed's lm_head at std 13.87), and an architecture
fingerprint compared with the declared config and with the previous verified checkpoint.

The keeper never imports torch: it hands checkpoints to a `WarmVerifier`, one child process
(`python -m trainroom.core.verify --serve`) that imports torch once and is reused for every
checkpoint; `verify_in_subprocess` is the one-shot form. The finding rules over a report
(`findings_for_report`) are pure and cheap to import; MASKED_ERROR and HOST_RAM_LOW are the
health rules' (`health.crash.masked_error`, `health.host.host_ram_low`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from trainroom.core import protocol as p
from trainroom.core.findings import Finding
from trainroom.core.health.crash import masked_error
from trainroom.core.probes.host import read_meminfo

# xxh3-128 measured here at 22.8 GB/s on one core, blake3 at 6.9 (12.8 on both cores), sha256 1.75.
# The digest guards against corruption, not an adversary, so the fastest good hash wins.
DIGEST_ALGO = "xxh3-128"
READ_CHUNK = 8 << 20
SCAN_CHUNK = 1 << 22  # elements per statistics chunk: bounds the float32 copies of bf16/fp16 data
# A weight matrix with a std above this is exploded (healthy ones sit in the tenths or below; the
# seed's "best" checkpoint had lm_head at 13.87 and a first loss of 96).
STD_EXPLODED = 5.0
# Flag (not reject) a matrix whose std is this many times the model's median matrix std.
STD_UNUSUAL_RATIO = 50.0
# Reject a tensor whose std grew this much since the previous verified checkpoint.
STD_GROWTH = 10.0
# What a full (non-mmap) load needs beyond the file itself: torch, the interpreter, the copy.
LOAD_HEADROOM = 512 << 20
# An mmap load reads pages through the page cache; statistics copy at most a few chunks.
MMAP_VERIFY_NEED = 256 << 20

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


# --------------------------------------------------------------------------- digest


def new_hasher() -> Any:
    return xxhash.xxh3_128()


def digest_hex(hasher: Any) -> str:
    return f"{DIGEST_ALGO}:{hasher.hexdigest()}"


def digest_file(path: str | os.PathLike[str]) -> str:
    h = new_hasher()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return digest_hex(h)


# --------------------------------------------------------------------------- rules (pure)


def load_need_bytes(size_bytes: int) -> int:
    """RAM a resume's full `torch.load(map_location="cpu")` of a checkpoint needs."""
    return int(size_bytes) + LOAD_HEADROOM


def rejected_finding(report: Mapping[str, Any]) -> Finding | None:
    """CKPT_REJECTED for a report that did not pass (a deferred one is not a rejection)."""
    if report.get("ok") or report.get("deferred"):
        return None
    path = str(report.get("path", ""))
    step = report.get("step")
    where = f"step {step} " if step is not None else ""
    return Finding(
        code="CKPT_REJECTED",
        severity="critical",
        key=path,
        action="verify",
        message=(
            f"checkpoint {where}({os.path.basename(path)}) rejected: {report.get('reason')}"
            + (
                "; it stays in quarantine and `latest` still points at the last verified one"
                if f"{os.sep}.quarantine{os.sep}" in path
                else ""
            )
        ),
        evidence={
            k: report.get(k)
            for k in (
                "path",
                "reason",
                "problems",
                "size_bytes",
                "digest",
                "expected_digest",
                "nonfinite",
                "outliers",
                "arch_mismatch",
                "refused_types",
                "step",
            )
            if report.get(k) not in (None, [], {})
        },
    )


def findings_for_report(report: Mapping[str, Any]) -> list[Finding]:
    """Every finding one verification report raises: CKPT_REJECTED, MASKED_ERROR."""
    out = [rejected_finding(report)]
    chain = report.get("error_chain") or []
    if chain:
        out.append(
            masked_error(
                chain,
                during=f"torch.load {os.path.basename(str(report.get('path', '')))}",
                key=str(report.get("path", "")),
            )
        )
    return [f for f in out if f is not None]


# --------------------------------------------------------------------------- helpers


def _first_line(s: str, limit: int = 200) -> str:
    line = (s or "").strip().splitlines()[0] if (s or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def sniff_format(path: str | os.PathLike[str]) -> str:
    """torch-zip, torch-legacy, pickle, safetensors, empty or unknown, from the first bytes."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        return "empty"
    if head[:2] == b"PK":
        return "torch-zip"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (100 << 20):
        return "safetensors"
    if head[:3] == b"\x80\x02\x8a":
        return "torch-legacy"  # torch's legacy envelope opens with its pickled magic number
    if head[:1] == b"\x80":
        return "pickle"  # a plain pickle.dump of the training state (a torch-free trainer)
    return "unknown"


def zip_end_present(path: str | os.PathLike[str], size: int) -> bool:
    """Whether the zip's end-of-central-directory record is where it must be, in the last 64 KiB:
    a torch.save archive cut short loses it first (torch's own error for that varies with the
    size: "failed finding central directory", or a bare EINVAL for a very short file)."""
    tail = min(size, 65_535 + 22)
    with open(path, "rb") as f:
        f.seek(size - tail)
        return b"PK\x05\x06" in f.read(tail)


def normalize_arch(cfg: Mapping[str, Any] | None) -> dict[str, int]:
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


def compare_arch(found: Mapping[str, Any], expected: Mapping[str, Any], against: str) -> list[dict[str, Any]]:
    exp = normalize_arch(expected)
    out: list[dict[str, Any]] = []
    for field, want in exp.items():
        got = found.get(field)
        if got is None or got == want:
            continue
        if field == "vocab" and against != "previous" and _vocab_padded(want, int(got)):
            continue
        out.append({"field": field, "expected": want, "found": got, "against": against})
    return out


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/Inf floats become None, tuples lists, keys strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# --------------------------------------------------------------------------- expectations


def discover_expected(path: Path) -> dict[str, Any]:
    """What was recorded about this file when it was written: the save-time sidecar
    (`<file>.saved.json`) or the manifest of the step directory holding it; for a quarantined
    candidate, the latest verified checkpoint as the previous one."""
    out: dict[str, Any] = {}
    sidecar = path.with_name(path.name + ".saved.json")
    manifest = path.parent / "manifest.json"
    for src in (sidecar, manifest):
        try:
            data = json.loads(src.read_text())
        except (OSError, ValueError):
            continue
        if src is manifest and data.get("file") != path.name:
            continue
        for k in ("digest", "size_bytes", "step"):
            if data.get(k) is not None:
                out[k] = data[k]
        break
    if path.parent.name == ".quarantine":
        from trainroom.core.ckpt import layout as checkpoints

        prev = checkpoints.latest_manifest(path.parent.parent)
        if prev:
            out["previous"] = {
                "path": prev.get("path", ""),
                "arch": (prev.get("report") or {}).get("arch", {}),
                "stds": (prev.get("report") or {}).get("stds", {}),
            }
    return out


# --------------------------------------------------------------------------- the scan (torch)


def _safe_globals() -> list[Any]:
    """Plain training-state types that weights_only refuses but that run no code on load."""
    import argparse as _argparse
    import pathlib

    out: list[Any] = [_argparse.Namespace, pathlib.PosixPath, pathlib.PurePosixPath]
    try:
        import numpy as np
    except ImportError:
        return out
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    scalar = getattr(getattr(core, "multiarray", None), "scalar", None)
    if scalar is not None:
        out.append(scalar)
    out.append(np.dtype)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for n in (
            "Float64DType",
            "Float32DType",
            "Float16DType",
            "Int64DType",
            "Int32DType",
            "Int16DType",
            "Int8DType",
            "UInt8DType",
            "BoolDType",
        ):
            if hasattr(dtypes, n):
                out.append(getattr(dtypes, n))
    return out


def _walk(obj: Any, prefix: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif depth > 64:
        return
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}.{i}" if prefix else str(i), depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__name__ == "Namespace":
        yield from _walk(vars(obj), prefix, depth + 1)


def _model_prefix(obj: Any) -> str | None:
    """Where the model's weights sit: the whole object (a bare state_dict), a well-known key
    (nanoGPT's "model"), or the largest dict of tensors not under an optimizer."""
    import torch

    def tensor_share(m: Any) -> float:
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


def _short_name(name: str, prefix: str | None) -> str:
    if prefix:
        name = name[len(prefix) + 1 :] if name.startswith(prefix + ".") else name
    for lead in ("_orig_mod.", "module."):
        while name.startswith(lead):
            name = name[len(lead) :]
    return name


def tensor_stats(t: Any, want_std: bool = True) -> tuple[int, int, float | None]:
    """(NaN count, Inf count, std over the finite values) in chunks: one fast float32 sum decides
    whether a chunk is finite; chunks merge with Chan's formula."""
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
    std = math.sqrt(m2 / n_tot) if want_std and n_tot > 0 else None
    return nan, inf, std


class _Inventory:
    """What the scan gathers, tensor by tensor."""

    def __init__(self, model_prefix: str | None, previous_stds: Mapping[str, float]) -> None:
        self.model_prefix = model_prefix
        self.previous_stds = previous_stds
        self.tensors = 0
        self.dtypes: dict[str, int] = {}
        self.nonfinite: dict[str, dict[str, int]] = {}
        self.stds: dict[str, float] = {}
        self.ndims: dict[str, int] = {}
        self.shapes: dict[str, list[int]] = {}
        self.params = 0
        self._storages: set[tuple[int, int, tuple[int, ...]]] = set()

    def add(self, name: str, t: Any) -> None:
        self.tensors += 1
        dt = str(t.dtype).removeprefix("torch.")
        self.dtypes[dt] = self.dtypes.get(dt, 0) + 1
        model = _is_model_tensor(name, self.model_prefix)
        nan, inf, std = tensor_stats(t, want_std=model)
        if nan or inf:
            self.nonfinite[name] = {"nan": nan, "inf": inf}
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

    def outliers(self) -> list[dict[str, Any]]:
        mats = [s for n, s in self.stds.items() if self.ndims.get(n, 0) >= 2]
        median = statistics.median(mats) if mats else None
        out: list[dict[str, Any]] = []
        for name, std in self.stds.items():
            prev = self.previous_stds.get(name)
            entry = {
                "name": name,
                "std": _sig(std, 4),
                "median_std": None if median is None else _sig(median, 4),
                "previous_std": None if prev is None else _sig(float(prev), 4),
            }
            if self.ndims.get(name, 0) >= 2 and std > STD_EXPLODED:
                out.append({**entry, "kind": "exploded", "why": f"std {std:.2f} > {STD_EXPLODED:g}"})
            elif prev is not None and prev > 0 and std > STD_GROWTH * prev and std > 0.5:
                out.append(
                    {
                        **entry,
                        "kind": "exploded",
                        "why": f"std {std:.3g} grew {std / prev:.0f}x since the previous checkpoint ({prev:.3g})",
                    }
                )
            elif median and self.ndims.get(name, 0) >= 2 and std > STD_UNUSUAL_RATIO * median and std > 1.0:
                out.append(
                    {**entry, "kind": "unusual", "why": f"std {std:.3g} is {std / median:.0f}x the median"}
                )
        out.sort(key=lambda e: -(e["std"] or 0))
        return out

    def arch(self) -> dict[str, Any]:
        layers = {m.group(1) for n in self.shapes for m in [_LAYER_RE.search(n)] if m}
        embed = next(
            (n for n in self.shapes if n.endswith(_EMBED_SUFFIXES) and len(self.shapes[n]) == 2), None
        )
        head = next((n for n in self.shapes if n.endswith(_HEAD_SUFFIXES) and len(self.shapes[n]) == 2), None)
        src = embed or head
        out: dict[str, Any] = {
            "layers": len(layers) if layers else None,
            "vocab": self.shapes[src][0] if src else None,
            "d_model": self.shapes[src][1] if src else None,
            "params": self.params,
        }
        if embed:
            out["embedding"] = embed
        if head:
            out["lm_head"] = head
        return out


def _load(path: Path, fmt: str) -> tuple[Iterator[tuple[str, Any]], Any]:
    """(tensor iterator, the loaded object or None for safetensors, streamed one tensor at a time)."""
    import torch

    if fmt == "safetensors":
        from safetensors import safe_open

        handle = safe_open(str(path), framework="pt", device="cpu")
        keys = list(handle.keys())

        def stream() -> Iterator[tuple[str, Any]]:
            for k in keys:
                yield k, handle.get_tensor(k)

        return stream(), dict.fromkeys(keys)
    if fmt == "pickle":
        obj = _load_plain_pickle(path)
        return _walk(obj, ""), obj
    with torch.serialization.safe_globals(_safe_globals()):
        obj = torch.load(str(path), weights_only=True, mmap=(fmt == "torch-zip"), map_location="cpu")
    return _walk(obj, ""), obj


def _load_plain_pickle(path: Path) -> Any:
    """A plain pickle, loaded the way weights_only loads: no global but plain containers, so
    nothing in the file can run code. torch.load refuses these files outright ("Invalid magic
    number", or weights_only's unsupported FRAME opcode of protocol 4+)."""
    import collections
    import pickle

    allowed = {("collections", "OrderedDict"): collections.OrderedDict}

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in allowed:
                return allowed[(module, name)]
            raise pickle.UnpicklingError(
                f"Unsupported global: {module}.{name} (a plain pickle may hold plain data only)"
            )

    with open(path, "rb") as f:
        return Restricted(f).load()


def translate_load_error(links: Sequence[p.ErrorLink], size_bytes: int) -> str:
    """One line that says what happened to the file, from the whole chain's text."""
    text = " | ".join(f"{x.type}: {x.message}" for x in links).lower()
    outer, inner = links[0], links[-1]
    if inner.errno_name == "ENOMEM" or "cannot allocate memory" in text or inner.type == "MemoryError":
        return f"out of memory while loading: {inner.type} [Errno 12 ENOMEM]: {_first_line(inner.message)}"
    if "central directory" in text:
        return f"truncated: the zip archive ends early (no central directory; {size_bytes} bytes on disk)"
    if any(
        s in text
        for s in (
            "eoferror",
            "ran out of input",
            "unexpected eof",
            "file not fully covered",
            "incomplete metadata",
            "header too small",
            "invalid header length",
            "unexpected end",
        )
    ):
        return f"truncated: the file ends early ({size_bytes} bytes on disk): {_first_line(inner.message)}"
    if any(s in text for s in ("invalid load key", "corrupt", "invalid header", "failed reading", "crc")):
        return f"corrupt: {_first_line(outer.message)}"
    errno_part = f" [Errno {inner.errno} {inner.errno_name}]" if inner.errno is not None else ""
    return f"load failed: {inner.type}{errno_part}: {_first_line(inner.message)}"


def _refused_types(path: Path) -> list[str]:
    import torch

    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in _safe_globals()}
    return sorted(set(found) - allowed)


def _top_level_step(obj: Any) -> int | None:
    if not isinstance(obj, Mapping):
        return None
    for k in STEP_KEYS:
        v = obj.get(k)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
        if hasattr(v, "numel") and v.numel() == 1 and not v.is_floating_point():
            return int(v.item())
    return None


def _in_file_config(obj: Any) -> Mapping[str, Any] | None:
    # nanoGPT keeps model_args beside the weights; Lightning keeps hyper_parameters.
    if isinstance(obj, Mapping):
        for k in ("model_args", "model_config", "hyper_parameters", "config"):
            v = obj.get(k)
            if isinstance(v, Mapping) and normalize_arch(v):
                return v
    return None


# --------------------------------------------------------------------------- verify


def verify(
    path: str | os.PathLike[str],
    expected: Mapping[str, Any] | None = None,
    *,
    discover: bool = True,
    meminfo_path: str = "/proc/meminfo",
) -> dict[str, Any]:
    """Verify one checkpoint file in this process (imports torch). `expected` may carry `digest`,
    `size_bytes`, `arch` (the declared config, any spelling) and `previous` ({path, arch, stds} of
    the previous verified checkpoint); with `discover`, what the file's sidecar or manifest
    recorded fills in what `expected` lacks."""
    import torch  # noqa: F401  (before the clock starts: `seconds` is the verification, not the import)

    t0 = time.perf_counter()
    path = Path(path)
    exp: dict[str, Any] = discover_expected(path) if discover else {}
    exp.update(expected or {})
    rep: dict[str, Any] = {
        "ok": False,
        "reason": None,
        "problems": [],
        "path": str(path),
        "format": None,
        "size_bytes": None,
        "digest": None,
        "digest_algo": DIGEST_ALGO,
        "expected_digest": exp.get("digest"),
        "digest_ok": None,
        "step": exp.get("step"),
        "tensors": 0,
        "params": 0,
        "dtypes": {},
        "nonfinite": {},
        "outliers": [],
        "arch": {},
        "arch_mismatch": [],
        "stds": {},
        "refused_types": [],
        "error_chain": [],
        "ram": {},
        "deferred": False,
        "seconds": 0.0,
    }
    problems: list[str] = rep["problems"]

    def done() -> dict[str, Any]:
        rep["ok"] = not problems
        rep["reason"] = problems[0] if problems else None
        rep["seconds"] = round(time.perf_counter() - t0, 4)
        return _clean(rep)

    try:
        size = path.stat().st_size
    except OSError as exc:
        problems.append(f"unreadable: {exc.strerror or exc}")
        return done()
    rep["size_bytes"] = size
    want_size = exp.get("size_bytes")
    if isinstance(want_size, int) and size != want_size:
        problems.append(
            f"truncated: {size} of {want_size} bytes on disk"
            if size < want_size
            else f"size changed: {size} bytes, {want_size} recorded at save time"
        )
    rep["digest"] = digest_file(path)
    if exp.get("digest"):
        rep["digest_ok"] = rep["digest"] == exp["digest"]
        if not rep["digest_ok"] and not problems:
            problems.append(
                f"digest mismatch: {rep['digest']} on disk, {exp['digest']} recorded at save time "
                "(the bytes changed after the save: a bit flip or an overwrite)"
            )
    fmt = rep["format"] = sniff_format(path)
    mem = read_meminfo(meminfo_path).get("MemAvailable")
    verify_need = MMAP_VERIFY_NEED if fmt in ("torch-zip", "safetensors") else load_need_bytes(size)
    rep["ram"] = {
        "mem_available": mem,
        "need_to_resume": load_need_bytes(size),
        "need_to_verify": verify_need,
    }
    if fmt == "empty":
        problems.append("truncated: empty file (0 bytes)")
        return done()
    if fmt == "torch-zip" and not zip_end_present(path, size):
        problems.append(f"truncated: the zip archive ends early (no central directory; {size} bytes on disk)")
        return done()
    if mem is not None and mem < verify_need:
        rep["deferred"] = True
        problems.append(
            f"not verified yet: host RAM {mem / 1e9:.1f} GB available, {verify_need / 1e9:.1f} GB needed"
        )
        return done()

    try:
        tensors, obj = _load(path, fmt)
    except Exception as exc:  # every load failure becomes a reason, never a traceback
        links = p.error_chain(exc)
        rep["error_chain"] = [msgspec.to_builtins(x) for x in links]
        text = " ".join(x.message for x in links)
        if "Weights only load failed" in text or "Unsupported global" in text:
            refused = _refused_types(path)
            rep["refused_types"] = refused
            problems.append(
                "refused type(s): "
                + (", ".join(refused) if refused else _first_line(links[-1].message))
                + " (weights_only loads tensors, containers and a few safe types only)"
            )
        else:
            problems.append(translate_load_error(links, size))
        return done()

    prefix = _model_prefix(obj)
    rep["model_key"] = prefix
    if rep["step"] is None:
        rep["step"] = _top_level_step(obj)
    previous = exp.get("previous") or {}
    inv = _Inventory(prefix, previous.get("stds") or {})
    try:
        for name, t in tensors:
            inv.add(name, t)
    except Exception as exc:  # a lazily read tensor (mmap, safetensors) can still fail here
        links = p.error_chain(exc)
        rep["error_chain"] = [msgspec.to_builtins(x) for x in links]
        problems.append(translate_load_error(links, size))
    rep["tensors"], rep["params"], rep["dtypes"] = inv.tensors, inv.params, inv.dtypes
    rep["nonfinite"] = inv.nonfinite
    rep["stds"] = {k: _sig(v) for k, v in inv.stds.items()}
    rep["outliers"] = inv.outliers()
    arch = rep["arch"] = inv.arch()
    if inv.nonfinite:
        worst = sorted(inv.nonfinite.items(), key=lambda kv: -(kv[1]["nan"] + kv[1]["inf"]))
        listed = ", ".join(f"{n} ({v['nan']} NaN, {v['inf']} Inf)" for n, v in worst[:3])
        problems.append(f"non-finite values in {len(inv.nonfinite)} tensor(s): {listed}")
    exploded = [o for o in rep["outliers"] if o["kind"] == "exploded"]
    if exploded:
        o = exploded[0]
        med = f", median {o['median_std']:.3g}" if o.get("median_std") else ""
        problems.append(
            f"exploded tensor: {o['name']} std {o['std']:.4g}{med} ({o['why']})"
            + (f" and {len(exploded) - 1} more" if len(exploded) > 1 else "")
        )
    mismatch: list[dict[str, Any]] = []
    if exp.get("arch"):
        mismatch += compare_arch(arch, exp["arch"], "declared")
    in_file = _in_file_config(obj)
    if in_file:
        mismatch += compare_arch(arch, in_file, "in-file config")
    if previous.get("arch"):
        mismatch += compare_arch(arch, previous["arch"], "previous")
    rep["arch_mismatch"] = mismatch
    if mismatch:
        parts = ", ".join(
            f"{m['field']} {m['expected']} -> {m['found']} ({m['against']})" for m in mismatch[:4]
        )
        problems.append(f"architecture changed: {parts}")
    return done()


def failure_report(path: str | os.PathLike[str], reason: str, **extra: Any) -> dict[str, Any]:
    """A report for a verification that could not run to the end (timeout, verifier died)."""
    return {
        "ok": False,
        "reason": reason,
        "problems": [reason],
        "path": str(path),
        "tensors": 0,
        "params": 0,
        "dtypes": {},
        "nonfinite": {},
        "outliers": [],
        "arch": {},
        "arch_mismatch": [],
        "digest": None,
        "size_bytes": None,
        "seconds": 0.0,
        **extra,
    }


def verify_in_subprocess(
    path: str | os.PathLike[str],
    expected: Mapping[str, Any] | None = None,
    timeout: float = 600.0,
    nice: int = 10,
) -> dict[str, Any]:
    """Verify in a short-lived child (torch stays out of the caller). Blocks up to `timeout`:
    call it from a worker thread. Never raises for a bad checkpoint or a dead verifier."""
    cmd = [sys.executable, "-m", "trainroom.core.ckpt.verify", str(path), "--json"]
    if expected:
        cmd += ["--expect-json", json.dumps(_clean(dict(expected)))]
    if nice:
        cmd += ["--nice", str(nice)]
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return failure_report(path, f"verifier timed out after {timeout:.0f} s", deferred=True)
    except OSError as exc:
        return failure_report(path, f"verifier could not start: {exc}", deferred=True)
    if cp.returncode in (0, 1):
        try:
            out = json.loads(cp.stdout)
            if isinstance(out, dict):
                return out
        except ValueError:
            pass
        return failure_report(
            path, f"verifier printed no report: {_first_line(cp.stderr or cp.stdout)}", deferred=True
        )
    if cp.returncode < 0:
        sig = signal.Signals(-cp.returncode).name
        hint = " (out of memory?)" if sig == "SIGKILL" else ""
        return failure_report(
            path, f"verifier killed by {sig}{hint} after {time.monotonic() - t0:.1f} s", deferred=True
        )
    tail = (cp.stderr or "").strip().splitlines()
    return failure_report(
        path,
        f"verifier failed (exit {cp.returncode}): {tail[-1] if tail else ''}".rstrip(": "),
        deferred=cp.returncode != 2,
    )


def _death_reason(returncode: int, elapsed_s: float, stderr_tail: str) -> str:
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        hint = " (out of memory?)" if sig == "SIGKILL" else ""
        return f"verifier killed by {sig}{hint} after {elapsed_s:.1f} s"
    return f"verifier failed (exit {returncode}): {stderr_tail}".rstrip(": ")


class WarmVerifier:
    """One verifier process with torch already imported, reused for every checkpoint of a run.

    Starting Python and importing torch costs ~2 s here, 20x the verification of a 400 MB
    checkpoint itself: a keeper that sees a checkpoint every step cannot pay it each time. The
    child (`python -m trainroom.core.verify --serve`) reads one JSON request a line and answers
    one JSON report a line. It is started on first use, restarted after it dies (the verdict in
    flight becomes a deferred failure report, never an exception), killed on a timeout, and
    closed after `idle_s` without work so an idle run holds no torch in memory. Thread-safe:
    one verification at a time. Torch never enters the caller's process.
    """

    def __init__(
        self,
        python: str | None = None,
        *,
        nice: int = 10,
        idle_s: float = 300.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.nice = nice
        self.idle_s = idle_s
        self.env = dict(env) if env is not None else None
        self.starts = 0  # processes started: 1 + restarts
        self.served = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buf = b""
        self._last_used = time.monotonic()
        self._ids = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> subprocess.Popen[bytes]:
        import tempfile

        self._stderr = tempfile.TemporaryFile()
        cmd = [self.python, "-m", "trainroom.core.ckpt.verify", "--serve", "--nice", str(self.nice)]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            close_fds=True,
            env=self.env,
            bufsize=0,
        )
        self._buf = b""
        self.starts += 1
        return self._proc

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 4096))
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        except (OSError, ValueError, AttributeError):
            return ""
        return lines[-1] if lines else ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        for f in (proc.stdin, proc.stdout, self._stderr):
            with contextlib.suppress(Exception):
                f.close()  # type: ignore[union-attr]
        self._stderr = None

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """One reply line, or None when the deadline passed (EOF raises EOFError)."""
        import select

        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def verify(
        self, path: str | os.PathLike[str], expected: Mapping[str, Any] | None = None, timeout: float = 600.0
    ) -> dict[str, Any]:
        """Verify `path` in the warm child; blocks (call it from a worker thread). The first call,
        and the first after a death or an idle close, also pays the child's start."""
        with self._lock:
            t0 = time.monotonic()
            self._ids += 1
            req = {
                "id": self._ids,
                "path": str(path),
                "expected": _clean(dict(expected)) if expected else None,
            }
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._stop()
                try:
                    proc = self._start()
                except OSError as exc:
                    return failure_report(path, f"verifier could not start: {exc}", deferred=True)
            try:
                assert proc.stdin is not None
                proc.stdin.write((json.dumps(req, allow_nan=False) + "\n").encode())
                line = self._read_line(proc, t0 + timeout)
            except (EOFError, BrokenPipeError, OSError):
                try:
                    rc = proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    rc = -signal.SIGKILL
                reason = _death_reason(rc, time.monotonic() - t0, self._stderr_tail())
                self._stop()
                return failure_report(path, reason, deferred=rc != 2)
            finally:
                self._last_used = time.monotonic()
            if line is None:
                self._stop()  # it may be stuck in a read: the next call starts a fresh one
                return failure_report(path, f"verifier timed out after {timeout:.0f} s", deferred=True)
            try:
                reply = json.loads(line)
                report = reply["report"]
                if reply.get("id") != req["id"] or not isinstance(report, dict):
                    raise ValueError("reply out of step")
            except (ValueError, KeyError, TypeError) as exc:
                self._stop()
                return failure_report(path, f"verifier answered garbage ({exc})", deferred=True)
            self.served += 1
            return report

    def close_if_idle(self, now: float | None = None) -> bool:
        """Close the child after `idle_s` without work (never while it verifies)."""
        if self._proc is None or not self._lock.acquire(blocking=False):
            return False
        try:
            now = time.monotonic() if now is None else now
            if self._proc is not None and now - self._last_used >= self.idle_s:
                self._stop()
                return True
            return False
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # EOF: the child leaves by itself
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            self._stop()


def serve(nice: int = 0) -> int:
    """The warm child: import torch once, then one JSON request in, one JSON report out, a line
    each, until stdin closes (the keeper exited or closed it)."""
    import gc

    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)
    try:
        import torch  # noqa: F401  (the point of this process: imported once)
    except ImportError as exc:
        print(f"trainroom verify --serve: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    # Replies go to the original stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for line in sys.stdin:
        if not line.strip():
            continue
        req: dict[str, Any] = {}
        try:
            req = json.loads(line)
            rep = verify(req["path"], req.get("expected") or None, discover=bool(req.get("discover", True)))
        except Exception as exc:  # one bad request never ends the server
            rep = failure_report(
                str(req.get("path", "")), f"verifier error: {type(exc).__name__}: {exc}", deferred=True
            )
        out.write(json.dumps({"id": req.get("id"), "report": _clean(rep)}, allow_nan=False) + "\n")
        out.flush()
        gc.collect(1)  # young cycles only: a full collection costs ~0.1 s with torch loaded
    return 0


# --------------------------------------------------------------------------- CLI


def _human(rep: Mapping[str, Any]) -> str:
    head = "OK      " if rep.get("ok") else "REJECTED"
    size = rep.get("size_bytes")
    lines = [
        f"{head} {rep.get('path')}  {_gb(size) if size is not None else '?'}  {rep.get('digest') or ''}  "
        f"({rep.get('seconds', 0):.2f} s)".rstrip()
    ]
    if not rep.get("ok"):
        lines.append(f"  reason: {rep.get('reason')}")
        lines += [f"  also: {x}" for x in (rep.get("problems") or [])[1:]]
    if rep.get("tensors"):
        dtypes = ", ".join(
            f"{k} {v}" for k, v in sorted((rep.get("dtypes") or {}).items(), key=lambda kv: -kv[1])
        )
        nan = sum(v.get("nan", 0) for v in (rep.get("nonfinite") or {}).values())
        inf = sum(v.get("inf", 0) for v in (rep.get("nonfinite") or {}).values())
        lines.append(
            f"  tensors {rep['tensors']} ({dtypes}); params {rep.get('params', 0):,}; {nan} NaN, {inf} Inf"
        )
        a = rep.get("arch") or {}
        lines.append(f"  arch: layers {a.get('layers')}, d_model {a.get('d_model')}, vocab {a.get('vocab')}")
    for o in (rep.get("outliers") or [])[:5]:
        lines.append(f"  {o['kind']}: {o['name']} std {o['std']} ({o['why']})")
    if rep.get("digest_ok") is True:
        lines.append("  digest matches the one recorded at save time")
    return "\n".join(lines)


def _configure(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "path",
        metavar="TARGET",
        nargs="?",
        default=None,
        help="a checkpoint file (.pt, .pth, .bin, .safetensors), a step directory, a checkpoint "
        "root (its `latest`), or a run (its `latest`; default: the newest run)",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument(
        "--expect-json",
        metavar="JSON",
        default=None,
        help='what the file must match: {"digest": ..., "size_bytes": ..., "arch": {...}, "previous": {...}}',
    )
    ap.add_argument(
        "--no-discover", action="store_true", help="ignore the sidecar / manifest recorded beside the file"
    )
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)


def add_parser(subparsers: Any) -> None:
    """`trainroom verify [TARGET] [--json]`: exit 0 verified, 1 rejected, 2 bad input."""
    ap = subparsers.add_parser(
        "verify",
        help="verify a checkpoint (integrity, NaN/Inf, exploded tensors, arch)",
        description="Verify a checkpoint: exit 0 verified, 1 rejected, 2 bad input. A file is verified here; "
        "a run's `latest` through its keeper while the keeper is up (journaled, its warm verifier), "
        "here once it is gone.",
    )
    _configure(ap)
    ap.set_defaults(func=run)


class _BadInput(Exception):
    """One line for stderr; exit 2."""


_CKPT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")


def _file_in(path: Path) -> Path:
    """The checkpoint a directory stands for: a step directory's file, a root's `latest`."""
    from trainroom.core.ckpt import layout as checkpoints

    manifest = path / "manifest.json"
    if manifest.is_file():
        try:
            name = json.loads(manifest.read_text()).get("file")
        except (OSError, ValueError) as exc:
            raise _BadInput(f"{manifest}: unreadable manifest: {exc}") from None
        if name and (path / str(name)).is_file():
            return path / str(name)
        raise _BadInput(f"{path}: the manifest names no file that is there")
    if (path / checkpoints.LATEST).exists() or (path / checkpoints.QUARANTINE).is_dir():
        latest = checkpoints.latest_checkpoint(path)
        if latest is None:
            raise _BadInput(f"{path}: no verified checkpoint (`latest` points nowhere)")
        return latest
    raise _BadInput(f"{path}: a directory that is neither a step directory nor a checkpoint root")


def _run_target(spec: str | None) -> tuple[Any, Path]:
    """(RunInfo, its checkpoint root) for a run spec (None: the newest run)."""
    from trainroom.core.run import store as runs

    try:
        info = runs.resolve_run(spec)
        rec = runs.read_record(Path(info.run_dir))
    except runs.RunError as exc:
        raise _BadInput(str(exc)) from None
    return info, Path(str(rec.options.get("ckpt_root") or Path(info.run_dir) / "checkpoints"))


def _via_keeper(info: Any, expected: dict[str, Any] | None) -> dict[str, Any] | None:
    """The keeper's `verify` action on its `latest` (journaled); None when the keeper is gone."""
    from trainroom.core.run.client import KeeperClient, KeeperGone

    args: dict[str, Any] = {"expected": expected} if expected else {}
    try:
        reply = KeeperClient(info.sock).call("verify", args, confirm=True)
    except KeeperGone:
        return None
    if not reply.after:
        raise _BadInput(f"run {info.run_id}: {reply.message}")
    return dict(reply.after)


def _parse_expected(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        expected = json.loads(text)
    except ValueError as exc:
        raise _BadInput(f"--expect-json is not JSON: {exc}") from None
    if not isinstance(expected, dict):
        raise _BadInput("--expect-json must be a JSON object")
    return expected


def run(args: argparse.Namespace) -> int:
    try:
        expected = _parse_expected(args.expect_json)
        rep = _verify_target(args, expected)
    except _BadInput as exc:
        print(f"trainroom verify: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"trainroom verify: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(_clean(rep), allow_nan=False) + "\n")
    else:
        print(_human(rep))
    return 0 if rep.get("ok") else 1


def _verify_target(args: argparse.Namespace, expected: dict[str, Any] | None) -> dict[str, Any]:
    target = args.path
    path = Path(target) if target else None
    if path is not None and path.is_file():
        file = path
    elif path is not None and path.is_dir():
        if (path / "run.msgpack").is_file():
            return _verify_run(str(path), expected, args)
        file = _file_in(path)
    elif path is not None and (os.sep in str(target) or str(target).endswith(_CKPT_SUFFIXES)):
        raise _BadInput(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    else:
        return _verify_run(target, expected, args)
    if getattr(args, "nice", 0):
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    return verify(file, expected, discover=not args.no_discover)


def _verify_run(
    spec: str | None, expected: dict[str, Any] | None, args: argparse.Namespace
) -> dict[str, Any]:
    from trainroom.core.ckpt import layout as checkpoints

    info, root = _run_target(spec)
    if info.alive:
        rep = _via_keeper(info, expected)
        if rep is not None:
            return rep
    latest = checkpoints.latest_checkpoint(root) if root.is_dir() else None
    if latest is None:
        raise _BadInput(f"run {info.run_id}: no verified checkpoint under {root} (`latest` points nowhere)")
    return verify(latest, expected, discover=not args.no_discover)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve"]:
        nice = int(args[2]) if len(args) >= 3 and args[1] == "--nice" else 0
        return serve(nice)
    ap = argparse.ArgumentParser(
        prog="python -m trainroom.core.ckpt.verify", description=__doc__.splitlines()[0]
    )
    _configure(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
