"""What a path stands for as a checkpoint, read off the file system (no torch, nothing loaded).

A checkpoint is a file (torch.save, safetensors, Lightning's `.ckpt`) or a directory that is one
checkpoint: a Hugging Face `checkpoint-N/` (every file in it belongs to the checkpoint) or a
`torch.distributed.checkpoint` directory (`.metadata` + `*.distcp` shards). A directory holding
such checkpoints (an HF `output_dir`, Lightning's `dirpath`) is a *framework root*: `verify`
takes its highest step, the keeper's watch each checkpoint in it.

The step of a checkpoint, when nothing inside says it (Lightning's `global_step` and nanoGPT's
`iter_num` are read by the verifier), comes from here: HF's `trainer_state.json`, a
safetensors header's metadata, then the name (`checkpoint-140`, `step=140.ckpt`, `iter_000140`),
then the directory holding it (`checkpoint-140/model.safetensors`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeGuard

import msgspec

from trainroom.core.probes import listing
from trainroom.core.vocab import DIR_KINDS, DirKind, PathKind

Kind = PathKind

HF_STATE = "trainer_state.json"
DCP_METADATA = ".metadata"
HF_DIR_RE = re.compile(r"^checkpoint-(\d+)$")
# The files that make a directory a Hugging Face checkpoint even under another name.
_HF_MARKERS = (
    HF_STATE,
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_model.safetensors",
)
# A step in a name: step=140, step-140, step_140, global_step140, iter_140, checkpoint-140, ...
_STEP_IN_NAME = re.compile(r"(?:global_step|step|iter|iteration|checkpoint|ckpt)[=_-]?(\d+)", re.IGNORECASE)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")
# Side files the watch and the root listing never take for checkpoints.
# A rejected checkpoint a resume moved out of its trainer's way, and what a restored verified
# copy replaced: kept as evidence, never a checkpoint again.
SET_ASIDE_SUFFIX = ".rejected"
BEFORE_RESUME_SUFFIX = ".before-resume"
SIDE_SUFFIXES = (
    ".tmp",
    ".saved.json",
    ".reason",
    ".verify.json",
    ".lock",
    ".partial",
    SET_ASIDE_SUFFIX,
    BEFORE_RESUME_SUFFIX,
)


class StepHint(msgspec.Struct, kw_only=True, frozen=True):
    step: int
    source: str  # trainer_state.json | safetensors metadata | the name | the directory name


def is_dcp_dir(path: Path) -> bool:
    return (path / DCP_METADATA).is_file()


def is_hf_dir(path: Path) -> bool:
    if HF_DIR_RE.match(path.name) and path.is_dir():
        return True
    return any((path / m).is_file() for m in _HF_MARKERS)


class DirFormat(NamedTuple):
    """A directory that is one checkpoint: its kind, how a message names it, how it is told
    (its verifier is `ckpt.dirs.VERIFIERS[kind]`)."""

    kind: DirKind
    words: str
    recognise: Callable[[Path], bool]


# Every directory checkpoint format, in the order they are tried: a DCP directory may hold a file
# an HF marker names, so DCP's own metadata decides first. The watch, `verify`, the CLI's target
# resolution and a root's listing all read this table.
DIR_FORMATS: tuple[DirFormat, ...] = (
    DirFormat("dcp-checkpoint", "a torch.distributed.checkpoint directory", is_dcp_dir),
    DirFormat("hf-checkpoint", "a Hugging Face checkpoint-N/", is_hf_dir),
)
DIR_WORDS = ", ".join(f.words for f in DIR_FORMATS)


def dir_kind(path: Path) -> DirKind | None:
    """The kind of directory checkpoint `path` is, or None (a plain directory, a root, a file)."""
    for f in DIR_FORMATS:
        if f.recognise(path):
            return f.kind
    return None


def is_dir_kind(kind: Kind) -> TypeGuard[DirKind]:
    return kind in DIR_KINDS


def kind_of(path: Path) -> Kind:
    """file, a directory checkpoint's kind (DIR_FORMATS), root (a directory of checkpoints) or other."""
    if path.is_file():
        return "file"
    if not path.is_dir():
        return "other"
    kind = dir_kind(path)
    if kind is not None:
        return kind
    return "root" if units_in(path) else "other"


def _hidden_or_side(name: str) -> bool:
    return name.startswith(".") or name.endswith(SIDE_SUFFIXES)


def units_in(root: Path) -> list[Path]:
    """The checkpoints directly inside a framework root: HF and DCP directories, and checkpoint
    files that carry a step in their name (Lightning's `step=20.ckpt`). Symlinks are not followed.
    Read off a cached listing (ckpt.listing): a root that also holds 100,000 other files costs a
    stat, not a rescan, while it does not change."""
    try:
        shaped = listing.select(root, "units", _unit_shaped)
    except OSError:
        return []
    return [
        root / e.name
        for e in shaped
        if e.is_file or listing.kind_of_dir(e.path, lambda p: dir_kind(Path(p))) is not None
    ]


def _unit_shaped(e: listing.Entry) -> bool:
    """What may be a checkpoint inside a root, told by the entry alone (a directory's kind is
    read from its files next)."""
    if _hidden_or_side(e.name) or e.is_symlink:
        return False
    return e.is_dir or (
        e.is_file and e.name.endswith(CHECKPOINT_SUFFIXES) and step_in_name(e.name) is not None
    )


def step_in_name(name: str) -> int | None:
    """The last step a name spells (`epoch=0-step=140.ckpt` is step 140)."""
    found = _STEP_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def hf_global_step(path: Path) -> int | None:
    """`global_step` from an HF checkpoint directory's trainer_state.json."""
    try:
        data = json.loads((path / HF_STATE).read_text())
    except (OSError, ValueError):
        return None
    step = data.get("global_step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The `__metadata__` of a safetensors header (strings only), read without loading a tensor."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n < (100 << 20):
                return {}
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def _int(text: str | None) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(str(text))
    return None


def step_hint(path: Path) -> StepHint | None:
    """The step a checkpoint's surroundings say (see the module docstring), or None."""
    if path.is_dir():
        if (path / HF_STATE).is_file():
            step = hf_global_step(path)
            if step is not None:
                return StepHint(step=step, source=HF_STATE)
        step = step_in_name(path.name)
        return StepHint(step=step, source="the directory name") if step is not None else None
    if path.name.endswith(".safetensors"):
        meta = safetensors_metadata(path)
        for key in ("step", "global_step", "iter_num", "iteration"):
            step = _int(meta.get(key))
            if step is not None:
                return StepHint(step=step, source="safetensors metadata")
    step = step_in_name(path.name)
    if step is not None:
        return StepHint(step=step, source="the file name")
    parent = path.parent
    if is_hf_dir(parent) and (parent / HF_STATE).is_file():
        step = hf_global_step(parent)
        if step is not None:
            return StepHint(step=step, source=f"{parent.name}/{HF_STATE}")
    step = step_in_name(parent.name)
    return StepHint(step=step, source="the directory name") if step is not None else None


def newest_unit(root: Path) -> Path | None:
    """A framework root's checkpoint with the highest step (then the newest)."""
    best: tuple[int, float, str] | None = None
    chosen = None
    for u in units_in(root):
        hint = step_hint(u)
        with contextlib.suppress(OSError):
            key = (hint.step if hint else -1, u.stat().st_mtime, u.name)
            if best is None or key > best:
                best, chosen = key, u
    return chosen


def files_of(path: Path) -> list[Path]:
    """A directory checkpoint's regular files, sorted, recursing into sub-directories (an HF
    checkpoint may hold a `global_step*/` DeepSpeed folder); symlinks are not followed."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames.sort()
        for n in sorted(filenames):
            p = Path(dirpath) / n
            if not p.is_symlink() and p.is_file():
                out.append(p)
    return out


def dir_version(path: Path) -> tuple[int, int, int] | None:
    """(bytes, newest mtime_ns, the directory's inode) of a directory checkpoint: it changes
    whenever a file in it is written, added or removed (the watch settles on it)."""
    try:
        st = path.stat()
    except OSError:
        return None
    size, newest = 0, st.st_mtime_ns
    for dirpath, _dirs, filenames in os.walk(path, followlinks=False):
        with contextlib.suppress(OSError):
            newest = max(newest, os.stat(dirpath).st_mtime_ns)
        for n in filenames:
            with contextlib.suppress(OSError):
                fs = os.lstat(os.path.join(dirpath, n))
                size += fs.st_size
                newest = max(newest, fs.st_mtime_ns)
    return size, newest, st.st_ino
