"""One checkpoint file verified: size and digest against the save-time record, the load (never
running code from the file), the tensors inventoried and judged, the step and the framework.

What a file holds (`TensorRole`) decides what its values mean: non-finite weights or optimizer state
reject, non-finite metadata (Lightning's `kth_value`, a scheduler's state) is reported. A file
inside a directory checkpoint gets its role from its name (`dirs`); a lone file works it out
from its layout. Torch is imported only by the functions that load.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

from trainroom.core.ckpt import archive as archive
from trainroom.core.ckpt import completeness as completeness
from trainroom.core.ckpt import formats as formats
from trainroom.core.ckpt import inventory as inventory
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.report import (
    Arch,
    ArchMismatch,
    Expected,
    Format,
    NonFinite,
    Outlier,
    RamNeed,
    VerifyReport,
)
from trainroom.core.ckpt.rules import load_need_bytes
from trainroom.core.probes.host import read_meminfo
from trainroom.core.resumable import Completeness
from trainroom.core.units import fmt_bytes
from trainroom.core.vocab import TensorRole
from trainroom.core.wire import protocol as p

# An mmap load reads pages through the page cache; statistics copy at most a few chunks.
MMAP_VERIFY_NEED = 256 << 20
# Shared containers (a pickle's memo references) a report says it met: a plain state has none.
SHARED_NOTED = 1
# A verification that took longer says so in its notes (what else waited on the verifier).
SLOW_VERIFY_S = 30.0


def _listed(found: Mapping[str, NonFinite], limit: int = 3) -> str:
    worst = sorted(found.items(), key=lambda kv: -(kv[1].nan + kv[1].inf))
    return ", ".join(f"{n} ({v.nan} NaN, {v.inf} Inf)" for n, v in worst[:limit])


def _framework(obj: object) -> str | None:
    if not isinstance(obj, Mapping):
        return None
    if "pytorch-lightning_version" in obj or ("global_step" in obj and "callbacks" in obj):
        return "lightning"
    if "iter_num" in obj and "model_args" in obj:
        return "nanogpt"
    return None


def _nonfinite_json(obj: object, where: str = "", depth: int = 0) -> list[str]:
    """Paths of NaN/Infinity numbers in parsed JSON (Python's json reads them)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return [where or "."]
    out: list[str] = []
    if depth < 32 and isinstance(obj, Mapping):
        for k, v in obj.items():
            out += _nonfinite_json(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif depth < 32 and isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _nonfinite_json(v, f"{where}[{i}]", depth + 1)
    return out


class FileCheck:
    """One verification under way: the problems found so far, and what the file turned out to be."""

    def __init__(self, path: Path, exp: Expected, role: TensorRole = "auto", *, whole: bool = True) -> None:
        self.t0 = time.perf_counter()
        self.path = path
        self.exp = exp
        self.role = role
        # False: one file of a directory checkpoint, whose weights are judged together (a shard
        # holds some layers: its own fingerprint would not be the model's).
        self.whole = whole
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.size: int | None = None
        self.digest: str | None = None
        self.digest_ok: bool | None = None
        self.format: Format | None = None
        self.ram: RamNeed | None = None
        self.deferred = False
        self.step = exp.step
        self.step_source: str | None = "save record" if exp.step is not None else None
        self.framework: str | None = None
        self.model_key: str | None = None
        self.error_chain: list[p.ErrorLink] = []
        self.refused: list[str] = []
        self.inv: inventory.Inventory | None = None
        self.mismatch: list[ArchMismatch] = []
        self.outliers: list[Outlier] = []
        self.arch = Arch()
        self.parsed: object = None  # a JSON file's content (the directory check reads it)
        self.holds: Completeness | None = None  # what the loaded state holds of a faithful resume

    def digest_only(self) -> None:
        """Size, digest and format of a file that is listed, not loaded (a tokenizer, a shard of
        a directory checkpoint read as a whole)."""
        try:
            self.size = self.path.stat().st_size
            self.digest = digest_file(self.path)
            self.format = formats.sniff_format(self.path)
        except OSError as exc:
            self.problems.append(f"unreadable: {exc.strerror or exc}")

    def read_file(self, meminfo_path: str) -> bool:
        """Size, digest, format and RAM; False when the load cannot (or must not) go on."""
        try:
            size = self.size = self.path.stat().st_size
        except OSError as exc:
            self.problems.append(f"unreadable: {exc.strerror or exc}")
            return False
        want = self.exp.size_bytes
        if want is not None and size != want:
            self.problems.append(
                f"truncated: {size} of {want} bytes on disk"
                if size < want
                else f"size changed: {size} bytes, {want} recorded at save time"
            )
        self.digest = digest_file(self.path)
        if self.exp.digest:
            self.digest_ok = self.digest == self.exp.digest
            if not self.digest_ok and not self.problems:
                self.problems.append(
                    f"digest mismatch: {self.digest} on disk, {self.exp.digest} recorded at save time "
                    "(the bytes changed after the save: a bit flip or an overwrite)"
                )
        fmt = self.format = formats.sniff_format(self.path)
        mem = read_meminfo(meminfo_path).get("MemAvailable")
        need = MMAP_VERIFY_NEED if fmt in ("torch-zip", "safetensors", "json") else load_need_bytes(size)
        self.ram = RamNeed(mem_available=mem, need_to_resume=load_need_bytes(size), need_to_verify=need)
        if fmt == "empty":
            self.problems.append("truncated: empty file (0 bytes)")
            return False
        if fmt == "torch-zip" and not formats.zip_end_present(self.path, size):
            self.problems.append(
                f"truncated: the zip archive ends early (no central directory; {size} bytes on disk)"
            )
            return False
        if mem is not None and mem < need:
            self.deferred = True
            self.problems.append(
                f"not verified yet: host RAM {fmt_bytes(mem)} available, {fmt_bytes(need)} needed"
            )
            return False
        return True

    def scan(self) -> None:
        """Load, inventory every tensor, and judge what they hold."""
        assert self.format is not None and self.size is not None
        if self.format == "json":
            self._read_json()
            return
        if self.role == "not-loaded":
            self._inspect_unloaded()
            return
        try:
            tensors, obj = formats.load(self.path, self.format)
        except Exception as exc:  # every load failure becomes a reason, never a traceback
            self._load_failed(exc)
            return
        self.model_key = inventory.model_prefix(obj) if self.role in ("auto", "model") else None
        self.framework = _framework(obj)
        self._find_step(obj)
        # Read off the object just loaded (keys and a few scalars): no second read of the file.
        self.holds = completeness.safely(
            completeness.of_state,
            obj,
            model_key="" if self.format == "safetensors" else self.model_key,
            framework=self.framework,
        )
        previous = self.exp.previous
        inv = self.inv = inventory.Inventory(self.model_key, previous.stds if previous else {}, self.role)
        try:
            for name, t in tensors:
                inv.add(name, t)
        except Exception as exc:  # a lazily read tensor (mmap, safetensors) can still fail here
            self.error_chain = p.error_chain(exc)
            self.problems.append(formats.translate_load_error(self.error_chain, self.size))
        if isinstance(tensors, inventory.Walker):
            self._walked(tensors)
        if self.format == "torch-zip" and not self.digest_ok:
            self._check_storages(obj)
        self._judge(inv, obj)

    def _walked(self, w: inventory.Walker) -> None:
        """A walk cut short by its budget cannot vouch for the state; many shared references
        (walked once each) are said."""
        if w.cut_short is not None:
            self.problems.append(f"not verified: {w.cut_short}")
        elif w.shared >= SHARED_NOTED:
            self.notes.append(
                f"{w.shared:,} container(s) reached again through shared references: each walked once "
                f"({w.entries:,} entries)"
            )

    def _find_step(self, obj: object) -> None:
        if self.step is not None:
            return
        found = inventory.step_in_state(obj)
        if found is not None:
            self.step, key = found
            self.step_source = f"its {key}"
            return
        hint = targets.step_hint(self.path)
        if hint is not None:
            self.step, self.step_source = hint.step, hint.source

    def _check_storages(self, obj: object) -> None:
        """No digest vouches for these bytes (or it did not match): the archive's own CRC-32s
        name the tensors whose bytes changed."""
        bad = archive.corrupt_storages(self.path, inventory.walk(obj, ""))
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            self.problems.insert(
                0,
                f"corrupt: {', '.join(bad[:3])}{more}: the tensor's bytes do not match the archive's "
                "CRC-32 (a flipped bit or an overwrite after the save)",
            )

    def _read_json(self) -> None:
        try:
            self.parsed = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            self.problems.append(f"corrupt: not JSON ({formats.first_line(str(exc))})")
            return
        odd = _nonfinite_json(self.parsed)
        if odd:
            self.notes.append(
                f"non-finite number(s) at {', '.join(odd[:3])}" + (" …" if len(odd) > 3 else "")
            )

    def _inspect_unloaded(self) -> None:
        """A file that is not unpickled (HF's training_args.bin): the archive checked as a zip."""
        if self.format != "torch-zip":
            self.notes.append(f"not loaded ({self.format}): digested only")
            return
        found = archive.check_archive(self.path)
        self.problems += found.problems
        if not found.problems:
            packages = sorted({g.split(".", 1)[0] for g in found.globals})
            self.notes.append(
                f"not unpickled (it would import {len(found.globals)} class(es) from "
                f"{', '.join(packages) or 'nowhere'}, which may run code on load); "
                f"{found.records} archive records match their CRC-32"
            )

    def _load_failed(self, exc: Exception) -> None:
        assert self.size is not None
        links = self.error_chain = p.error_chain(exc)
        text = " ".join(x.message for x in links)
        if "Weights only load failed" in text or "Unsupported global" in text:
            self.refused = formats.refused_types(self.path)
            self.problems.append(
                "refused type(s): "
                + (", ".join(self.refused) if self.refused else formats.first_line(links[-1].message))
                + " (weights_only loads tensors, containers and a few safe types only)"
            )
        else:
            self.problems.append(formats.translate_load_error(links, self.size))

    def _judge(self, inv: inventory.Inventory, obj: object) -> None:
        if inv.nonfinite:
            self.problems.append(
                f"non-finite values in {len(inv.nonfinite)} tensor(s): {_listed(inv.nonfinite)}"
            )
        if inv.nonfinite_metadata:
            self.notes.append(
                f"non-finite values in {len(inv.nonfinite_metadata)} metadata tensor(s), not weights or "
                f"optimizer state: {_listed(inv.nonfinite_metadata)}"
            )
        if self.whole:
            self.judge_weights(inv, inventory.in_file_config(obj))

    def judge_weights(self, inv: inventory.Inventory, in_file: Mapping[str, object] | None) -> None:
        """Exploded tensors, and the fingerprint against the declared config, the checkpoint's
        own config and the previous verified checkpoint."""
        self.outliers = inv.outliers()
        exploded = [o for o in self.outliers if o.kind == "exploded"]
        if exploded:
            o = exploded[0]
            med = f", median {o.median_std:.3g}" if o.median_std else ""
            self.problems.append(
                f"exploded tensor: {o.name} std {o.std:.4g}{med} ({o.why})"
                + (f" and {len(exploded) - 1} more" if len(exploded) > 1 else "")
            )
        if not inv.shapes:
            return  # no weights here (an optimizer's or a scheduler's file): no architecture
        arch = self.arch = inv.arch()
        if self.exp.arch:
            self.mismatch += inventory.compare_arch(arch, self.exp.arch, "declared")
        if in_file:
            self.mismatch += inventory.compare_arch(arch, in_file, "in-file config")
        if self.exp.previous is not None:
            self.mismatch += inventory.compare_arch(arch, self.exp.previous.arch, "previous")
        if self.mismatch:
            parts = ", ".join(f"{m.field} {m.expected} -> {m.found} ({m.against})" for m in self.mismatch[:4])
            self.problems.append(f"architecture changed: {parts}")

    def report(self) -> VerifyReport:
        inv = self.inv
        took = time.perf_counter() - self.t0
        if took >= SLOW_VERIFY_S:
            self.notes.append(f"verification took {took:.0f} s (other checkpoints waited for the verifier)")
        return VerifyReport(
            ok=not self.problems,
            reason=self.problems[0] if self.problems else None,
            problems=self.problems,
            path=str(self.path),
            format=self.format,
            size_bytes=self.size,
            digest=self.digest,
            expected_digest=self.exp.digest,
            digest_ok=self.digest_ok,
            step=self.step,
            model_key=self.model_key,
            tensors=inv.tensors if inv else 0,
            params=inv.params if inv else 0,
            dtypes=inv.dtypes if inv else {},
            nonfinite=inv.nonfinite if inv else {},
            nonfinite_metadata=inv.nonfinite_metadata if inv else {},
            outliers=self.outliers,
            arch=self.arch,
            arch_mismatch=self.mismatch,
            stds={k: inventory.sig(v) for k, v in inv.stds.items()} if inv else {},
            refused_types=self.refused,
            error_chain=self.error_chain,
            ram=self.ram,
            deferred=self.deferred,
            seconds=round(time.perf_counter() - self.t0, 4),
            framework=self.framework,
            step_source=self.step_source if self.step is not None else None,
            notes=self.notes,
            completeness=self.holds if self.whole else None,
        )


def check_file(
    path: Path, exp: Expected, meminfo_path: str, role: TensorRole = "auto", *, whole: bool = True
) -> FileCheck:
    """Verify one file (imports torch when it loads one); the check, for its report and parts."""
    check = FileCheck(path, exp, role, whole=whole)
    if check.read_file(meminfo_path):
        check.scan()
    return check
