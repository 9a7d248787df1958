"""The checkpoint verifier: what makes a written checkpoint a good one, or says why it is not.

Checks, in order: size and digest against what was recorded at save time (one flipped byte in
tensor data loads without any error: only the digest catches it), the load itself
(`torch.load(weights_only=True, mmap=True, map_location="cpu")`, or safetensors) with its error
translated and unwrapped to the innermost cause, a tensor inventory, NaN/Inf per tensor, per-tensor
std with exploded tensors flagged (the seed's lm_head at std 13.87), and an architecture
fingerprint compared with the declared config and with the previous verified checkpoint.

`verify()` runs here and imports torch. The keeper never does: it hands checkpoints to the warm
verifier process (`ckpt.verifier`). The pieces: `digest`, `formats` (sniffing, safe loading),
`inventory` (tensors, statistics, fingerprint), `report` (the records), `rules` (the findings).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ckpt import formats as formats
from trainroom.core.ckpt import inventory as inventory
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.report import Arch, ArchMismatch, Expected, Format, Outlier, RamNeed, VerifyReport
from trainroom.core.ckpt.rules import load_need_bytes
from trainroom.core.probes.host import read_meminfo
from trainroom.core.units import fmt_bytes

__all__ = ["discover_expected", "load_need_bytes", "verify"]

# An mmap load reads pages through the page cache; statistics copy at most a few chunks.
MMAP_VERIFY_NEED = 256 << 20


def discover_expected(path: Path) -> Expected:
    """What was recorded about this file when it was written: the save-time sidecar
    (`<file>.saved.json`) or the manifest of the step directory holding it; for a quarantined
    candidate, the latest verified checkpoint as the previous one."""
    found = Expected()
    side = layout.read_saved(path)
    manifest = layout.read_manifest(path.parent) if side is None else None
    if side is not None:
        found = Expected(digest=side.digest, size_bytes=side.size_bytes, step=side.step)
    elif manifest is not None and manifest.file == path.name:
        found = Expected(digest=manifest.digest, size_bytes=manifest.size_bytes, step=manifest.step)
    if path.parent.name == layout.QUARANTINE:
        found = msgspec.structs.replace(found, previous=layout.previous_verified(path.parent.parent))
    return found


class _Check:
    """One verification under way: the problems found so far, and what the file turned out to be."""

    def __init__(self, path: Path, exp: Expected) -> None:
        self.t0 = time.perf_counter()
        self.path = path
        self.exp = exp
        self.problems: list[str] = []
        self.size: int | None = None
        self.digest: str | None = None
        self.digest_ok: bool | None = None
        self.format: Format | None = None
        self.ram: RamNeed | None = None
        self.deferred = False
        self.step = exp.step
        self.model_key: str | None = None
        self.error_chain: list[p.ErrorLink] = []
        self.refused: list[str] = []
        self.inv: inventory.Inventory | None = None
        self.mismatch: list[ArchMismatch] = []
        self.outliers: list[Outlier] = []
        self.arch = Arch()

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
        need = MMAP_VERIFY_NEED if fmt in ("torch-zip", "safetensors") else load_need_bytes(size)
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
        try:
            tensors, obj = formats.load(self.path, self.format)
        except Exception as exc:  # every load failure becomes a reason, never a traceback
            self._load_failed(exc)
            return
        self.model_key = inventory.model_prefix(obj)
        if self.step is None:
            self.step = inventory.top_level_step(obj)
        previous = self.exp.previous
        inv = self.inv = inventory.Inventory(self.model_key, previous.stds if previous else {})
        try:
            for name, t in tensors:
                inv.add(name, t)
        except Exception as exc:  # a lazily read tensor (mmap, safetensors) can still fail here
            self.error_chain = p.error_chain(exc)
            self.problems.append(formats.translate_load_error(self.error_chain, self.size))
        self._judge(inv, obj)

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
            worst = sorted(inv.nonfinite.items(), key=lambda kv: -(kv[1].nan + kv[1].inf))
            listed = ", ".join(f"{n} ({v.nan} NaN, {v.inf} Inf)" for n, v in worst[:3])
            self.problems.append(f"non-finite values in {len(inv.nonfinite)} tensor(s): {listed}")
        self.outliers = inv.outliers()
        exploded = [o for o in self.outliers if o.kind == "exploded"]
        if exploded:
            o = exploded[0]
            med = f", median {o.median_std:.3g}" if o.median_std else ""
            self.problems.append(
                f"exploded tensor: {o.name} std {o.std:.4g}{med} ({o.why})"
                + (f" and {len(exploded) - 1} more" if len(exploded) > 1 else "")
            )
        arch = self.arch = inv.arch()
        if self.exp.arch:
            self.mismatch += inventory.compare_arch(arch, self.exp.arch, "declared")
        in_file = inventory.in_file_config(obj)
        if in_file:
            self.mismatch += inventory.compare_arch(arch, in_file, "in-file config")
        if self.exp.previous is not None:
            self.mismatch += inventory.compare_arch(arch, self.exp.previous.arch, "previous")
        if self.mismatch:
            parts = ", ".join(f"{m.field} {m.expected} -> {m.found} ({m.against})" for m in self.mismatch[:4])
            self.problems.append(f"architecture changed: {parts}")

    def report(self) -> VerifyReport:
        inv = self.inv
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
            outliers=self.outliers,
            arch=self.arch,
            arch_mismatch=self.mismatch,
            stds={k: inventory.sig(v) for k, v in inv.stds.items()} if inv else {},
            refused_types=self.refused,
            error_chain=self.error_chain,
            ram=self.ram,
            deferred=self.deferred,
            seconds=round(time.perf_counter() - self.t0, 4),
        )


def verify(
    path: str | os.PathLike[str],
    expected: Expected | None = None,
    *,
    discover: bool = True,
    meminfo_path: str = "/proc/meminfo",
) -> VerifyReport:
    """Verify one checkpoint file in this process (imports torch). `expected` may carry the
    digest, size and step recorded at save time, the declared config (`arch`, any spelling) and
    the previous verified checkpoint; with `discover`, what the file's sidecar or manifest
    recorded fills in what `expected` lacks."""
    import torch  # noqa: F401  (before the clock starts: `seconds` is the verification, not the import)

    path = Path(path)
    exp = (discover_expected(path) if discover else Expected()).merged(expected)
    check = _Check(path, exp)
    if check.read_file(meminfo_path):
        check.scan()
    return check.report()
