"""Directory checkpoints verified as one: a Hugging Face `checkpoint-N/` (every file in it) and a
`torch.distributed.checkpoint` directory.

Hugging Face: the weights (`model.safetensors`, each shard a `model.safetensors.index.json`
names, or `pytorch_model.bin`) are streamed a tensor at a time with `safetensors` (no pickle);
`optimizer.pt` is optimizer state (a non-finite value rejects); `scheduler.pt`, `scaler.pt` and
`rng_state*.pth` are metadata (loaded `weights_only`, numpy's RNG state allowed; a non-finite
value is reported); `training_args.bin` is never unpickled (it is a pickled `TrainingArguments`,
whose classes run code on load; weights_only refuses it): its zip records are checked against
their CRC-32 and its pickle read as opcodes to its end. `trainer_state.json` gives the step and
`config.json` the declared architecture; a directory without `trainer_state.json` is a save that
did not finish (HF writes it last).

torch.distributed.checkpoint: `.metadata` is a pickle too; it is read by an unpickler that
imports only DCP's own metadata classes, `torch.Size` and dtypes. Every shard file must cover the
bytes the metadata gives it; the tensors are then read through `dcp.load(no_dist=True)` into
tensors of the metadata's shapes (each read `weights_only`, as DCP does), and non-tensor entries
(`step`, param groups) loaded `weights_only` too, never with DCP's default `weights_only=False`.

The report's digest is xxh3-128 over the sorted `name digest` lines of every file.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainroom.core.ckpt import completeness as completeness
from trainroom.core.ckpt import formats as formats
from trainroom.core.ckpt import inventory as inventory
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.digest import digest_hex, new_hasher
from trainroom.core.ckpt.filecheck import FileCheck, check_file
from trainroom.core.ckpt.report import (
    Arch,
    Expected,
    FileVerdict,
    Format,
    NonFinite,
    VerifyReport,
)
from trainroom.core.ckpt.rules import load_need_bytes
from trainroom.core.probes.host import read_meminfo
from trainroom.core.resumable import Completeness
from trainroom.core.units import fmt_bytes
from trainroom.core.vocab import DirKind, TensorRole
from trainroom.core.wire import protocol as p

if TYPE_CHECKING:
    import torch

_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
_INDEX_SUFFIX = ".index.json"


def hf_role(name: str) -> TensorRole:
    """What a file of an HF checkpoint holds, from its name."""
    if name == "training_args.bin":
        return "not-loaded"
    if name.endswith(".json"):
        return "config"
    if name in _WEIGHTS or (name.startswith(("model-", "pytorch_model-")) and "-of-" in name):
        return "model"
    if name.startswith("optimizer"):
        return "optimizer"
    if name.startswith(("scheduler", "scaler", "rng_state")):
        return "metadata"
    if name.endswith(targets.CHECKPOINT_SUFFIXES):
        return "auto"
    return "other"


def dir_digest(entries: list[tuple[str, str | None]]) -> str:
    h = new_hasher()
    for name, d in sorted(entries):
        h.update(f"{name} {d or '-'}\n".encode())
    return digest_hex(h)


class _Totals:
    """A directory's files folded into one report."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: list[FileVerdict] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.size = 0
        self.tensors = 0
        self.params = 0
        self.dtypes: dict[str, int] = {}
        self.nonfinite: dict[str, NonFinite] = {}
        self.nonfinite_metadata: dict[str, NonFinite] = {}
        self.deferred = False
        # The weights of every model file (shards included), judged as one model.
        self.weights: FileCheck | None = None
        self.model_files: list[str] = []
        self.json: dict[str, object] = {}
        self.present: set[str] = set()
        # (name, role, tensors, what a loaded file holds) of each file; the whole checkpoint's.
        self.holds: list[tuple[str, str, int, Completeness | None]] = []
        self.completeness: Completeness | None = None

    def add(self, rel: str, check: FileCheck) -> None:
        rep = check.report()
        self.size += rep.size_bytes or 0
        self.tensors += rep.tensors
        self.params += rep.params
        for k, n in rep.dtypes.items():
            self.dtypes[k] = self.dtypes.get(k, 0) + n
        self.nonfinite.update({f"{rel}:{k}": v for k, v in rep.nonfinite.items()})
        self.nonfinite_metadata.update({f"{rel}:{k}": v for k, v in rep.nonfinite_metadata.items()})
        self.problems += [f"{rel}: {x}" for x in rep.problems]
        self.notes += [f"{rel}: {x}" for x in rep.notes]
        self.deferred = self.deferred or rep.deferred
        self.present.add(rel)
        self.holds.append((rel, check.role, rep.tensors, check.holds))
        if check.role == "model" and check.inv is not None:
            self.model_files.append(rel)
            if self.weights is None:
                self.weights = FileCheck(self.root, Expected(), "model")
                self.weights.inv = inventory.Inventory("", {})
            assert self.weights.inv is not None
            self.weights.inv.merge(check.inv)
        if check.parsed is not None:
            self.json[rel] = check.parsed
        self.files.append(
            FileVerdict(
                name=rel,
                role=check.role,
                format=rep.format,
                size_bytes=rep.size_bytes or 0,
                digest=rep.digest,
                tensors=rep.tensors,
                ok=rep.ok,
                reason=rep.reason,
            )
        )


def _check_index(root: Path, totals: _Totals) -> None:
    """Each sharded-safetensors index: every shard it names is there."""
    for index in sorted(root.glob(f"*{_INDEX_SUFFIX}")):
        data = totals.json.get(index.name)
        weight_map = data.get("weight_map") if isinstance(data, Mapping) else None
        if not isinstance(weight_map, Mapping):
            totals.problems.append(f"{index.name}: no weight_map")
            continue
        missing = sorted({str(s) for s in weight_map.values()} - totals.present)
        if missing:
            totals.problems.append(f"{index.name}: shard(s) missing: {', '.join(missing[:3])}")


def verify_hf(path: Path, exp: Expected, meminfo_path: str) -> VerifyReport:
    t0 = time.perf_counter()
    totals = _Totals(path)
    files = targets.files_of(path)
    for f in files:
        rel = str(f.relative_to(path))
        role = hf_role(f.name)
        if role == "other":
            check = FileCheck(f, Expected(), "other")
            check.digest_only()  # a tokenizer file, say: a resume may read it, nothing to load
        else:
            check = check_file(f, Expected(), meminfo_path, role, whole=False)
        totals.add(rel, check)
    _check_index(path, totals)
    if not totals.model_files:
        totals.problems.append("no weights: none of model.safetensors, its shards or pytorch_model.bin")
    if not (path / targets.HF_STATE).is_file():
        totals.problems.append(
            f"incomplete: no {targets.HF_STATE} (the Trainer writes it last: the save did not finish)"
        )
    totals.completeness = completeness.safely(
        completeness.of_hf, totals.holds, totals.json.get(targets.HF_STATE)
    )
    if totals.weights is not None:
        config = totals.json.get("config.json")
        _judge_weights(totals, totals.weights, exp, config if isinstance(config, Mapping) else None)
    step = targets.hf_global_step(path)
    source = targets.HF_STATE if step is not None else None
    if step is None and (hint := targets.step_hint(path)) is not None:
        step, source = hint.step, hint.source
    return _report(
        path, exp, totals, t0, fmt="hf-checkpoint", framework="hugging-face", step=step, source=source
    )


def _judge_weights(
    totals: _Totals, weights: FileCheck, exp: Expected, config: Mapping[str, object] | None
) -> None:
    """Every weights file as one model: exploded tensors, the fingerprint against the declared
    config, config.json and the previous verified checkpoint."""
    assert weights.inv is not None
    merged = inventory.Inventory("", exp.previous.stds if exp.previous else {})
    merged.merge(weights.inv)
    weights.exp = Expected(arch=exp.arch, previous=exp.previous)
    weights.judge_weights(merged, config)
    weights.inv = merged
    where = ", ".join(totals.model_files[:2]) + (" …" if len(totals.model_files) > 2 else "")
    totals.problems += [f"{where}: {x}" for x in weights.problems]


def _report(
    path: Path,
    exp: Expected,
    totals: _Totals,
    t0: float,
    *,
    fmt: Format,
    framework: str,
    step: int | None,
    source: str | None,
    model_key: str | None = None,
) -> VerifyReport:
    digest = dir_digest([(f.name, f.digest) for f in totals.files])
    problems = list(totals.problems)
    digest_ok = None
    if exp.digest:
        digest_ok = digest == exp.digest
        if not digest_ok:
            problems.append(
                f"digest mismatch: {digest} on disk, {exp.digest} recorded when it verified "
                "(a file in it changed since)"
            )
    if exp.step is not None:
        step, source = exp.step, "save record"
    m = totals.weights
    inv = m.inv if m is not None else None
    deferred = totals.deferred and all("not verified yet" in x for x in problems)
    return VerifyReport(
        ok=not problems,
        reason=problems[0] if problems else None,
        problems=problems,
        path=str(path),
        format=fmt,
        size_bytes=totals.size,
        digest=digest,
        expected_digest=exp.digest,
        digest_ok=digest_ok,
        step=step,
        model_key=model_key
        if model_key is not None
        else (totals.model_files[0] if totals.model_files else None),
        tensors=totals.tensors,
        params=totals.params,
        dtypes=totals.dtypes,
        nonfinite=totals.nonfinite,
        nonfinite_metadata=totals.nonfinite_metadata,
        outliers=m.outliers if m else [],
        arch=m.arch if m else Arch(),
        arch_mismatch=m.mismatch if m else [],
        stds={k: inventory.sig(v) for k, v in inv.stds.items()} if inv else {},
        deferred=deferred,
        seconds=round(time.perf_counter() - t0, 4),
        framework=framework,
        step_source=source if step is not None else None,
        files=totals.files,
        notes=totals.notes,
        completeness=totals.completeness,
    )


# --------------------------------------------------------------------------- torch.distributed.checkpoint

# What DCP's `.metadata` pickle may import: its own dataclasses, torch.Size, dtypes and a path.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_DCP_GLOBALS = {("torch", "Size"), ("pathlib", "PosixPath"), ("torch.serialization", "_get_layout")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if module in _DCP_MODULES or (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global: {module}.{name} (not DCP metadata)")


def read_dcp_metadata(path: Path) -> Any:
    """A DCP directory's `.metadata`, unpickled with DCP's own classes only; a symlink or anything
    but a regular file there is refused, never opened through."""
    fd = os.open(path / targets.DCP_METADATA, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        return _MetadataUnpickler(f).load()


def _no_bytes(message: str) -> str:
    """An error's message with what it quotes of the file's bytes left out (an unpickler's
    "invalid load key, 'r'" names the first byte of whatever it was given)."""
    return re.sub(r"""(['"]).{0,40}?\1""", "'…'", message)


def _shard_outside(path: Path, rel: str) -> str | None:
    """Why the shard the metadata names is not a file of this checkpoint (None: it is): an
    absolute path, a `..`, a symlink or anything but a regular file inside the directory."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts:
        return "names a file outside the checkpoint directory: refused, not opened"
    try:
        st = (path / rel).lstat()
    except OSError:
        return None  # missing: said by the cover check
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link: refused, not opened"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file: refused, not opened"
    return None


def _dcp_template(md: Any) -> dict[str, Any]:
    """Empty CPU tensors of the metadata's shapes, one per tensor entry; non-tensor entries by key."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out: dict[str, Any] = {}
    for fqn, item in md.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            out[fqn] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
        else:
            out[fqn] = None
    return out


def _dcp_load(path: Path, md: Any) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    class Reader(FileSystemReader):  # type: ignore[misc]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return md

    class Planner(DefaultLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            with torch.serialization.safe_globals(formats.safe_globals()):
                loaded = torch.load(value, weights_only=True)
            self.original_state_dict[read_item.dest_index.fqn] = loaded

    state = _dcp_template(md)
    planner = Planner(flatten_state_dict=False, flatten_sharded_tensors=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
        dcp.load(state, storage_reader=Reader(str(path)), planner=planner, no_dist=True)
    return state


def _nest(flat: Mapping[str, Any], md: Any) -> dict[str, Any]:
    """The flat DCP keys back into the saved nesting (planner_data keeps each key's path)."""
    paths = getattr(md, "planner_data", None) or {}
    out: dict[str, Any] = {}
    for fqn, v in flat.items():
        parts = [str(x) for x in paths.get(fqn, (fqn,))]
        node = out
        for k in parts[:-1]:
            nxt = node.setdefault(k, {})
            node = nxt if isinstance(nxt, dict) else {}
        node[parts[-1]] = v
    return out


def _shards_cover(path: Path, md: Any) -> list[str]:
    """Each shard file exists and holds the bytes the metadata places in it."""
    need: dict[str, int] = {}
    for info in (getattr(md, "storage_data", None) or {}).values():
        rel = str(info.relative_path)
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    out = []
    for rel, n in sorted(need.items()):
        outside = _shard_outside(path, rel)
        if outside is not None:
            out.append(f"{rel[:120]}: {outside}")
            continue
        try:
            have = (path / rel).stat().st_size
        except OSError:
            out.append(f"{rel}: missing (the metadata places {n} bytes in it)")
            continue
        if have < n:
            out.append(f"{rel}: truncated: {have} of {n} bytes on disk")
    return out


def _dcp_crc(path: Path, md: Any) -> list[str]:
    """The entries whose bytes no longer match their CRC-32: DCP writes each tensor as its own
    torch.save archive inside the shard, and its load (like torch.load) never checks them."""
    import zipfile

    bad: list[str] = []
    by_file: dict[str, list[tuple[str, int, int]]] = {}
    for index, info in (getattr(md, "storage_data", None) or {}).items():
        by_file.setdefault(str(info.relative_path), []).append(
            (index.fqn, int(info.offset), int(info.length))
        )
    for rel, items in sorted(by_file.items()):
        with open(path / rel, "rb") as f:
            for fqn, offset, length in sorted(items, key=lambda x: x[1]):
                f.seek(offset)
                blob = f.read(length)
                if not blob.startswith(b"PK"):
                    continue
                try:
                    with zipfile.ZipFile(io.BytesIO(blob)) as z:
                        broken = z.testzip()
                except zipfile.BadZipFile:
                    broken = "the archive"
                if broken is not None:
                    bad.append(fqn)
    return bad


def _dcp_tensors(state: Mapping[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    return inventory.walk(state, "")


def verify_dcp(path: Path, exp: Expected, meminfo_path: str) -> VerifyReport:
    t0 = time.perf_counter()
    totals = _Totals(path)
    for f in targets.files_of(path):
        check = FileCheck(f, Expected(), "other")
        check.digest_only()  # shards are read through DCP below, as one state
        totals.add(str(f.relative_to(path)), check)
    step, source = None, None
    try:
        md = read_dcp_metadata(path)
    except Exception as exc:  # a damaged or foreign .metadata is a reason, never a traceback
        said = _no_bytes(formats.first_line(str(exc)))
        totals.problems.append(f".metadata: corrupt: {type(exc).__name__}: {said}")
        md = None
    if md is not None:
        totals.problems += _shards_cover(path, md)
    if md is not None and not totals.problems:
        bad = _dcp_crc(path, md)
        if bad:
            totals.problems.append(
                f"corrupt: {', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}: the entry's bytes do not match "
                "their CRC-32 (a flipped bit or an overwrite after the save)"
            )
    model_key = None
    if md is not None and not totals.problems:
        need = load_need_bytes(totals.size)
        mem = read_meminfo(meminfo_path).get("MemAvailable")
        if mem is not None and mem < need:
            totals.deferred = True
            totals.problems.append(
                f"not verified yet: host RAM {fmt_bytes(mem)} available, {fmt_bytes(need)} needed"
            )
        else:
            model_key, found = _scan_dcp(path, md, exp, totals)
            if found is not None:
                step, source = found[0], f"its {found[1]}"
    if step is None and (hint := targets.step_hint(path)) is not None:
        step, source = hint.step, hint.source
    if md is not None and totals.completeness is None:  # not loaded: what its keys say
        totals.completeness = completeness.safely(
            completeness.of_state, completeness.dcp_skeleton(md), framework="dcp"
        )
    return _report(
        path,
        exp,
        totals,
        t0,
        fmt="dcp-checkpoint",
        framework="dcp",
        step=step,
        source=source,
        model_key=model_key,
    )


def _scan_dcp(
    path: Path, md: Any, exp: Expected, totals: _Totals
) -> tuple[str | None, tuple[int, str] | None]:
    """Load the tensors through DCP and inventory them as one training state."""
    try:
        state = _nest(_dcp_load(path, md), md)
    except Exception as exc:  # a load failure is a reason
        totals.problems.append(formats.translate_load_error(p.error_chain(exc), totals.size))
        return None, None
    check = FileCheck(path, Expected(previous=exp.previous, arch=exp.arch), "auto")
    check.model_key = inventory.model_prefix(state)
    inv = check.inv = inventory.Inventory(check.model_key, exp.previous.stds if exp.previous else {})
    for name, t in _dcp_tensors(state):
        inv.add(name, t)
    check._judge(inv, state)
    totals.completeness = completeness.safely(
        completeness.of_state, state, model_key=check.model_key, framework="dcp"
    )
    totals.weights = check
    totals.tensors, totals.params, totals.dtypes = inv.tensors, inv.params, inv.dtypes
    totals.nonfinite, totals.nonfinite_metadata = inv.nonfinite, inv.nonfinite_metadata
    totals.problems += check.problems
    totals.notes += check.notes
    return check.model_key, inventory.step_in_state(state)


# How each directory checkpoint format (`targets.DIR_FORMATS`) is verified.
Verifier = Callable[[Path, Expected, str], VerifyReport]
VERIFIERS: dict[DirKind, Verifier] = {"hf-checkpoint": verify_hf, "dcp-checkpoint": verify_dcp}
