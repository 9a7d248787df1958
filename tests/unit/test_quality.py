"""The checks that keep the code as it is meant to be, run with the tests (so CI runs them): ruff
(with a complexity limit of 15), ruff's formatter, mypy (strict, see pyproject.toml), no source
file over 600 lines. Every public name the README and docs document (and every older path) is
checked in tests/unit/test_public_names.py."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "trainroom"
MAX_LINES = 600


def _tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_ruff_check_is_clean() -> None:
    done = _tool("ruff", "check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-1000:]


def test_ruff_format_leaves_nothing_to_change() -> None:
    done = _tool("ruff", "format", "--check", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-1000:]


def test_mypy_is_clean() -> None:
    done = _tool("mypy")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-1000:]


def test_no_source_file_is_over_600_lines() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 60  # the glob found the sources, or this would prove nothing
    long = {str(f.relative_to(ROOT)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_tools_are_the_ones_the_test_extra_pins() -> None:
    """ruff and mypy come with `pip install -e .[test]`; a missing one is a setup error, not a skip."""
    for tool in ("ruff", "mypy"):
        assert importlib.util.find_spec(tool) is not None or shutil.which(tool), f"{tool} is not installed"
