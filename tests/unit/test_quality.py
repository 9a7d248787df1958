"""The checks that keep the code as it is meant to be, run with the tests (so CI runs them): ruff
(with a complexity limit of 15), ruff's formatter, mypy (strict, see pyproject.toml), no source
file over 600 lines, and every public name the README documents still importable."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "trainroom"
MAX_LINES = 600

# What a trainer imports (README: "The trainer SDK"), and the wire protocol other tools speak.
PUBLIC_NAMES = [
    ("trainroom.core", "sdk"),
    ("trainroom.core.sdk", "connect"),
    ("trainroom.core.sdk", "current"),
    ("trainroom.core.sdk", "Reporter"),
    ("trainroom.core.sdk", "reimpose_lr"),
    ("trainroom.core.sdk", "save_checkpoint"),
    ("trainroom.core.sdk", "latest_checkpoint"),
    ("trainroom.core.sdk", "verified_checkpoints"),
    ("trainroom.core.sdk", "NonFiniteTracer"),
    ("trainroom.core.protocol", "Hello"),
    ("trainroom.core.protocol", "Step"),
    ("trainroom.core.protocol", "frame"),
    ("trainroom.cli", "main"),
    # The one-line adapters (README: Real trainers), with the `integrations` extra installed.
    ("trainroom.integrations.hf", "TrainroomCallback"),
    ("trainroom.integrations.lightning", "TrainroomCallback"),
]


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


@pytest.mark.parametrize(("module", "name"), PUBLIC_NAMES)
def test_documented_public_names_import(module: str, name: str) -> None:
    # `from trainroom.core import sdk` finds a subpackage, `from ... import connect` a name.
    mod = importlib.import_module(module)
    assert hasattr(mod, name) or importlib.import_module(f"{module}.{name}")


def test_the_tools_are_the_ones_the_test_extra_pins() -> None:
    """ruff and mypy come with `pip install -e .[test]`; a missing one is a setup error, not a skip."""
    for tool in ("ruff", "mypy"):
        assert importlib.util.find_spec(tool) is not None or shutil.which(tool), f"{tool} is not installed"
