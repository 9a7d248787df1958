"""The checkpoint verifier: what makes a written checkpoint a good one, or says why it is not.

Checks, in order: size and digest against what was recorded at save time (one flipped byte in
tensor data loads without any error: the digest catches it, or where none was recorded, the CRC-32
torch.save keeps of every storage), the load itself (`torch.load(weights_only=True, mmap=True,
map_location="cpu")`, or safetensors) with its error translated and unwrapped to the innermost
cause, a tensor inventory, NaN/Inf per tensor (rejecting in weights and optimizer state, reported
in metadata), per-tensor std with exploded tensors flagged (scenario 5: an lm_head at std 13.87), and
an architecture fingerprint compared with the declared config and with the previous verified
checkpoint. A directory checkpoint (Hugging Face `checkpoint-N/`, torch.distributed.checkpoint)
is verified file by file and judged as one (`dirs`).

`verify()` runs here and imports torch. The keeper never does: it hands checkpoints to the warm
verifier process (`ckpt.verifier`). The pieces: `digest`, `formats` (sniffing, safe loading),
`archive` (zip CRCs, pickles read without unpickling), `targets` (what a path is, its step),
`inventory` (tensors, statistics, fingerprint), `filecheck` (one file), `dirs` (a directory),
`report` (the records), `rules` (the findings).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from trainroom.core.ckpt import dirs as dirs
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.filecheck import MMAP_VERIFY_NEED, check_file
from trainroom.core.ckpt.report import Expected, VerifyReport, failure_report
from trainroom.core.ckpt.rules import load_need_bytes
from trainroom.core.probes.host import read_meminfo

__all__ = ["MMAP_VERIFY_NEED", "discover_expected", "load_need_bytes", "read_meminfo", "verify"]


def discover_expected(path: Path) -> Expected:
    """What was recorded about this checkpoint when it was written: the save-time sidecar
    (`<file>.saved.json`) or the manifest of the step directory holding it; for a quarantined
    candidate, the latest verified checkpoint as the previous one."""
    found = Expected()
    side = layout.read_saved(path)
    manifest = layout.read_manifest(path.parent) if side is None else None
    if side is not None:
        found = Expected(digest=side.digest, size_bytes=side.size_bytes, step=side.step)
    elif manifest is not None and manifest.file == path.name:
        # A directory checkpoint's size is not compared (the manifest keeps the tree's bytes).
        size = manifest.size_bytes if path.is_file() else None
        found = Expected(digest=manifest.digest, size_bytes=size, step=manifest.step)
    if path.parent.name == layout.QUARANTINE:
        found = msgspec.structs.replace(found, previous=layout.previous_verified(path.parent.parent))
    return found


def verify(
    path: str | os.PathLike[str],
    expected: Expected | None = None,
    *,
    discover: bool = True,
    meminfo_path: str = "/proc/meminfo",
) -> VerifyReport:
    """Verify one checkpoint in this process (imports torch): a file, or a directory that is one
    checkpoint (Hugging Face `checkpoint-N/`, torch.distributed.checkpoint). `expected` may carry
    the digest, size and step recorded at save time, the declared config (`arch`, any spelling)
    and the previous verified checkpoint; with `discover`, what the file's sidecar or manifest
    recorded fills in what `expected` lacks."""
    import torch  # noqa: F401  (before the clock starts: `seconds` is the verification, not the import)

    path = Path(path)
    exp = (discover_expected(path) if discover else Expected()).merged(expected)
    kind = targets.kind_of(path)
    if targets.is_dir_kind(kind):
        return dirs.VERIFIERS[kind](path, exp, meminfo_path)
    if kind != "file" and path.is_dir():
        return failure_report(path, f"not a checkpoint: a directory that is none of {targets.DIR_WORDS}")
    return check_file(path, exp, meminfo_path).report()
