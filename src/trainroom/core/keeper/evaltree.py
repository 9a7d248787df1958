"""What an evaluation may have written into the checkpoint it was given: the tree's state (each
entry's size and mtime, never through a symlink) before and after, and moving out what it added."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

MAX_ENTRIES = 100_000  # a checkpoint directory holds far fewer: the walk is bounded all the same


def tree_state(path: str) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime_ns) of `path` (a file: its own entry, "") and everything
    under it, symlinks as themselves."""
    out: dict[str, tuple[int, int]] = {}
    try:
        st = os.lstat(path)
    except OSError:
        return out
    out[""] = (st.st_size, st.st_mtime_ns) if not stat.S_ISDIR(st.st_mode) else (0, 0)
    if not stat.S_ISDIR(st.st_mode):
        return out
    stack = [""]
    while stack and len(out) < MAX_ENTRIES:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(path, rel) if rel else path) as it:
                for e in it:
                    name = f"{rel}/{e.name}" if rel else e.name
                    try:
                        est = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(est.st_mode):
                        out[name] = (0, 0)
                        stack.append(name)
                    else:
                        out[name] = (est.st_size, est.st_mtime_ns)
        except OSError:
            continue
    return out


def move_out(root: Path, added: list[str], dest: Path) -> int:
    """Move the entries an evaluation added under `root` to `dest` (the topmost of each added
    subtree once); how many were moved."""
    tops = [a for a in added if a and not any(a.startswith(o + "/") for o in added if o != a)]
    n = 0
    for rel in tops:
        target = dest / rel
        with contextlib.suppress(OSError, shutil.Error):
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() or target.is_symlink():
                target = target.with_name(f"{target.name}.{os.getpid()}.{n}")
            shutil.move(str(root / rel), str(target))
            n += 1
    return n
