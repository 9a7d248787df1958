"""Directory listings (of a checkpoint root above all), read again only when the directory changed.

The keeper looks at its checkpoint root every second (what prune could free, the framework
checkpoints in it, the watched globs, a byte budget). A root that also holds a dataset or a
cache (100,000 files) must not cost a rescan and a stat per file each time: a directory is
listed with one `scandir` (its entries' types come with the listing, no stat each), and listed
again only when its mtime changed (an entry added, removed or renamed) or changed too recently
to trust (a change within the filesystem's timestamp granularity could hide behind the same
mtime: RACY_S, as git treats a racily clean index).

`tree_bytes` (a byte budget's usage) re-stats the files of a large directory that holds no
checkpoint-shaped entry only every SLOW_S (its own files; its sub-directories are measured as
usual): its bytes are someone's data, not a save in progress.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

RACY_S = 2.0
MAX_CACHED = 256  # directories whose listing is kept
BIG_DIR = 2000  # entries from which a directory without checkpoints is re-measured slowly
SLOW_S = 30.0
CHECKPOINT_SHAPED = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar", ".distcp", ".metadata")


class Entry(NamedTuple):
    name: str
    path: str
    is_dir: bool  # not following a symlink
    is_file: bool  # not following a symlink
    is_symlink: bool


class _Listed(NamedTuple):
    key: tuple[int, int, int]  # (st_dev, st_ino, st_mtime_ns) of the directory
    entries: tuple[Entry, ...]


class _Measured(NamedTuple):
    key: tuple[int, int, int]
    at: float  # monotonic
    total: int


_lock = threading.Lock()
_listed: dict[str, _Listed] = {}
_kinds: dict[str, tuple[tuple[int, int, int], object]] = {}
_measured: dict[str, _Measured] = {}
scans = 0  # directories actually listed (the rest came from the cache): for the benchmark


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _trusted(st: os.stat_result) -> bool:
    return time.time() - st.st_mtime > RACY_S


def _remember(cache: dict[str, object], path: str, value: object) -> None:
    cache.pop(path, None)
    cache[path] = value
    while len(cache) > MAX_CACHED:
        cache.pop(next(iter(cache)))


def entries(directory: str | os.PathLike[str]) -> tuple[Entry, ...]:
    """The entries of `directory`, sorted by name; OSError as os.scandir raises it."""
    global scans
    path = os.path.abspath(directory)
    st = os.stat(path)
    key = _key(st)
    hit = _listed.get(path)
    if hit is not None and hit.key == key and _trusted(st):
        return hit.entries
    with os.scandir(path) as it:
        found = [
            Entry(
                e.name,
                e.path,
                e.is_dir(follow_symlinks=False),
                e.is_file(follow_symlinks=False),
                e.is_symlink(),
            )
            for e in it
        ]
    found.sort(key=lambda e: e.name)
    out = tuple(found)
    with _lock:
        scans += 1
        _remember(_listed, path, _Listed(key, out))  # type: ignore[arg-type]
    return out


_selected: dict[tuple[str, str], tuple[tuple[Entry, ...], tuple[Entry, ...]]] = {}


def select(directory: str | os.PathLike[str], name: str, keep: Callable[[Entry], bool]) -> tuple[Entry, ...]:
    """The entries `keep` takes (a test of the entry alone, named `name`), computed once per
    listing: 100,000 unrelated files are looked through when the directory changes, not each call."""
    listed = entries(directory)
    key = (os.path.abspath(directory), name)
    hit = _selected.get(key)
    if hit is not None and hit[0] is listed:
        return hit[1]
    out = tuple(e for e in listed if keep(e))
    with _lock:
        _remember(_selected, key, (listed, out))  # type: ignore[arg-type]
    return out


def kind_of_dir(path: str, recognise: Callable[[str], object]) -> object:
    """`recognise(path)` (a directory's checkpoint kind, read from the files in it), kept while
    the directory's own mtime says nothing was added or removed in it."""
    try:
        st = os.stat(path)
    except OSError:
        return recognise(path)
    key = _key(st)
    hit = _kinds.get(path)
    if hit is not None and hit[0] == key and _trusted(st):
        return hit[1]
    kind = recognise(path)
    with _lock:
        _remember(_kinds, path, (key, kind))  # type: ignore[arg-type]
    return kind


def _checkpoint_shaped(e: Entry) -> bool:
    return e.name.endswith(CHECKPOINT_SHAPED)


def tree_bytes(root: str | os.PathLike[str], depth: int = 64) -> int:
    """Bytes under `root` by lstat, never following a symlink (a symlink counts its own size)."""
    path = os.fspath(root)
    try:
        st = os.lstat(path)
        listed = entries(path)
    except OSError:
        return 0
    key = _key(st)
    slow = len(listed) >= BIG_DIR and not select(path, "checkpoint-shaped", _checkpoint_shaped)
    hit = _measured.get(path)
    own: int | None = None
    if slow and hit is not None and hit.key == key and time.monotonic() - hit.at < SLOW_S and _trusted(st):
        own = hit.total
    if own is None:
        own = 0
        for e in listed:
            if not e.is_dir or e.is_symlink:
                try:
                    own += os.lstat(e.path).st_size
                except OSError:
                    pass
        if slow:
            with _lock:
                _remember(_measured, path, _Measured(key, time.monotonic(), own))  # type: ignore[arg-type]
    total = own
    if depth > 0:
        for e in listed:
            if e.is_dir and not e.is_symlink:
                total += tree_bytes(e.path, depth - 1)
    return total
