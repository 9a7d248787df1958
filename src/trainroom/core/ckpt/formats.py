"""Checkpoint file formats: what a file is from its first bytes, how it is loaded without running
any code in it, and what a failed load says in one line.

torch.save's zip archive is loaded `weights_only=True` with mmap; its legacy format and plain
pickles are loaded whole; safetensors are streamed a tensor at a time. The allow-list of pickle
globals (`safe_globals`) holds plain training-state types only: nothing that runs code on load.
Torch is imported only inside the functions that load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainroom.core.ckpt.inventory import walk
from trainroom.core.ckpt.report import Format
from trainroom.core.wire import protocol as p

if TYPE_CHECKING:
    import torch

SafeGlobal = Callable[..., object]


class _SafeTensors(Protocol):
    """What the verifier uses of safetensors' `safe_open` handle."""

    def keys(self) -> list[str]: ...

    def get_tensor(self, name: str) -> torch.Tensor: ...


_TRUNCATED_HINTS = (
    "eoferror",
    "ran out of input",
    "unexpected eof",
    "file not fully covered",
    "incomplete metadata",
    "header too small",
    "invalid header length",
    "unexpected end",
)
_CORRUPT_HINTS = ("invalid load key", "corrupt", "invalid header", "failed reading", "crc")


def first_line(s: str, limit: int = 200) -> str:
    line = (s or "").strip().splitlines()[0] if (s or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def sniff_format(path: str | os.PathLike[str]) -> Format:
    """torch-zip, torch-legacy, pickle, safetensors, empty or unknown, from the first bytes."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not head:
        return "empty"
    if os.fspath(path).endswith(".json") and head.lstrip()[:1] in (b"{", b"["):
        return "json"
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


def safe_globals() -> list[SafeGlobal]:
    """Plain training-state types that weights_only refuses but that run no code on load."""
    import argparse
    import pathlib

    out: list[SafeGlobal] = [argparse.Namespace, pathlib.PosixPath, pathlib.PurePosixPath]
    try:
        import numpy as np
    except ImportError:
        return out
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    multiarray = getattr(core, "multiarray", None)
    # numpy scalars and arrays (HF's rng_state.pth holds numpy's RNG state): `_reconstruct` makes
    # an empty array of an allowed type, and the array's state is plain data read by the same
    # restricted unpickler; the same list transformers passes for its own RNG files.
    out.extend(getattr(multiarray, fn) for fn in ("scalar", "_reconstruct") if hasattr(multiarray, fn))
    out += [np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        names = (
            "Float64DType",
            "Float32DType",
            "Float16DType",
            "Int64DType",
            "Int32DType",
            "Int16DType",
            "Int8DType",
            "UInt8DType",
            "UInt16DType",
            "UInt32DType",
            "UInt64DType",
            "BoolDType",
        )
        out.extend(getattr(dtypes, n) for n in names if hasattr(dtypes, n))
    return out


def load(path: Path, fmt: Format) -> tuple[Iterator[tuple[str, torch.Tensor]], object]:
    """(the tensors by name, the loaded object), the safetensors streamed one tensor at a time
    (the object is then their names)."""
    import torch

    if fmt == "safetensors":
        from safetensors import safe_open

        handle: _SafeTensors = safe_open(str(path), framework="pt", device="cpu")
        keys = list(handle.keys())

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for k in keys:
                yield k, handle.get_tensor(k)

        return stream(), dict.fromkeys(keys)
    if fmt == "pickle":
        obj = load_plain_pickle(path)
        return walk(obj, ""), obj
    with torch.serialization.safe_globals(safe_globals()):
        obj = torch.load(str(path), weights_only=True, mmap=(fmt == "torch-zip"), map_location="cpu")
    return walk(obj, ""), obj


def load_plain_pickle(path: Path) -> object:
    """A plain pickle, loaded the way weights_only loads: no global but plain containers, so
    nothing in the file can run code. torch.load refuses these files outright ("Invalid magic
    number", or weights_only's unsupported FRAME opcode of protocol 4+)."""
    import collections
    import pickle

    allowed: Mapping[tuple[str, str], type] = {("collections", "OrderedDict"): collections.OrderedDict}

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> type:
            if (module, name) in allowed:
                return allowed[(module, name)]
            raise pickle.UnpicklingError(
                f"Unsupported global: {module}.{name} (a plain pickle may hold plain data only)"
            )

    with open(path, "rb") as f:
        loaded: object = Restricted(f).load()
    return loaded


def refused_types(path: Path) -> list[str]:
    """The globals a torch archive holds that the allow-list does not: what weights_only refused."""
    import torch

    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in safe_globals()}
    return sorted(set(found) - allowed)


def translate_load_error(links: Sequence[p.ErrorLink], size_bytes: int) -> str:
    """One line that says what happened to the file, from the whole chain's text."""
    text = " | ".join(f"{x.type}: {x.message}" for x in links).lower()
    outer, inner = links[0], links[-1]
    if inner.errno_name == "ENOMEM" or "cannot allocate memory" in text or inner.type == "MemoryError":
        return f"out of memory while loading: {inner.type} [Errno 12 ENOMEM]: {first_line(inner.message)}"
    if "central directory" in text:
        return f"truncated: the zip archive ends early (no central directory; {size_bytes} bytes on disk)"
    if any(s in text for s in _TRUNCATED_HINTS):
        return f"truncated: the file ends early ({size_bytes} bytes on disk): {first_line(inner.message)}"
    if any(s in text for s in _CORRUPT_HINTS):
        return f"corrupt: {first_line(outer.message)}"
    errno_part = f" [Errno {inner.errno} {inner.errno_name}]" if inner.errno is not None else ""
    return f"load failed: {inner.type}{errno_part}: {first_line(inner.message)}"
