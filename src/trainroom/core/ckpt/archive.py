"""torch.save's zip archive read as a zip: the CRC-32 it keeps of every record, and what its pickle
names, without unpickling anything.

torch.save writes a CRC-32 of every storage record but torch.load never checks it, so a flipped
bit in tensor data loads without an error. Where no digest was recorded at save time (a watched
file, a framework's own checkpoint) the record CRCs are the only reference: `corrupt_storages`
finds the tensors whose bytes no longer match any record's CRC, naming them. A file that must not
be unpickled at all (HF's `training_args.bin`, a pickled `TrainingArguments` whose classes run
code on load) is checked as an archive: every record against its CRC, the pickle's opcodes read
to its STOP, and the globals it would import listed.
"""

from __future__ import annotations

import contextlib
import pickletools
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    import torch


class ArchiveCheck(msgspec.Struct, kw_only=True, frozen=True):
    """A torch zip archive checked without loading it."""

    problems: list[str] = []
    records: int = 0
    globals: list[str] = []  # what its pickle would import


def record_crcs(path: Path) -> set[tuple[int, int]] | None:
    """(size, CRC-32) of every storage record (`<archive>/data/<key>`); None when the archive
    carries none (a writer that skipped them leaves 0) or cannot be read as a zip."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = [i for i in z.infolist() if "/data/" in i.filename and not i.is_dir()]
    except (OSError, zipfile.BadZipFile):
        return None
    if not infos or all(i.CRC == 0 for i in infos if i.file_size):
        return None
    return {(i.file_size, i.CRC) for i in infos}


def _storage_crc(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(data pointer, bytes, CRC-32) of a tensor's whole storage, without copying it."""
    import torch

    s = t.untyped_storage()
    n = s.nbytes()
    if n == 0 or t.device.type != "cpu":
        return None
    raw = torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,))
    try:
        view = raw.numpy()
    except (RuntimeError, TypeError):  # torch built without numpy
        return None
    return s.data_ptr(), n, zlib.crc32(view)


def corrupt_storages(path: Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str] | None:
    """The names of the tensors whose storage bytes match no record's CRC-32 (a flipped bit, an
    overwrite); None when the archive has no CRCs to compare with. The tensors must come from an
    mmap load of `path` (their bytes are the file's)."""
    crcs = record_crcs(path)
    if crcs is None:
        return None
    seen: dict[int, bool] = {}
    bad: list[str] = []
    for name, t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            got = _storage_crc(t)
            seen[ptr] = got is None or (got[1], got[2]) in crcs
        if not seen[ptr]:
            bad.append(name)
    return bad


def pickle_globals(data: bytes) -> list[str]:
    """The `module.name` globals a pickle would import, read from its opcodes (nothing runs).
    Raises ValueError when the opcodes do not read to a STOP (a cut or damaged pickle)."""
    out: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("GLOBAL", "INST") and isinstance(arg, str):
                out.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                out.append(f"{strings[-2]}.{strings[-1]}")
            if isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
    except Exception as exc:  # pickletools raises ValueError and friends on bad opcodes
        raise ValueError(f"the pickle does not read to its end ({exc})") from None
    return sorted(set(out))


def check_archive(path: Path) -> ArchiveCheck:
    """Every record of a torch zip archive against its CRC-32, and its pickle's opcodes and
    globals, without unpickling it."""
    problems: list[str] = []
    names: list[str] = []
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            bad = None
            with contextlib.suppress(zipfile.BadZipFile):
                bad = z.testzip()
            if bad is not None:
                problems.append(f"corrupt: archive record {bad} does not match its CRC-32")
            pkl = next((i for i in infos if i.filename.endswith("/data.pkl")), None)
            if pkl is None:
                problems.append("corrupt: no data.pkl record (not a torch.save archive)")
            elif pkl.filename != bad:
                names = pickle_globals(z.read(pkl))
    except zipfile.BadZipFile as exc:
        return ArchiveCheck(problems=[f"corrupt: not a readable zip archive ({exc})"])
    except (OSError, ValueError) as exc:
        problems.append(f"corrupt: {exc}")
        infos = []
    return ArchiveCheck(problems=problems, records=len(infos), globals=names)
