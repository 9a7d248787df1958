"""A small real filesystem a test can fill: a tmpfs of its own (needs root), and the writer that
fills it to ENOSPC (the same way tests/e2e/test_never_blind.py fills a state dir)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(size: str = "16m", prefix: str = "trfs") -> Iterator[Path]:
    """A directory with a tmpfs of `size` mounted on it; skips the test where it cannot mount."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip() or done.returncode}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        shutil.rmtree(d, ignore_errors=True)


def fill(path: Path) -> None:
    """Write until the filesystem says ENOSPC (and nothing else)."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == 28, exc
