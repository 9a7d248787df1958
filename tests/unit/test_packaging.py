"""Packaging and import hygiene: installed under trainroom.*, core without textual or torch."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import trainroom

ROOT = Path(__file__).resolve().parents[2]
HEADLESS = [
    "trainroom.core.wire.protocol",
    "trainroom.core.keeper.loop",
    "trainroom.core.cli.main",
    "trainroom.core.run.status",
    "trainroom.core.sdk.reporter",
    "trainroom.core.run.state",
    "trainroom.core.run.client",
    "trainroom.core.run.store",
]


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_modules_import_without_textual_or_torch(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "bad = [m for m in ('textual', 'rich', 'torch', 'trainroom.tui') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{module} pulled in {out.stdout.strip()}"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import statement in a file."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) in top))
    return out


def test_core_never_imports_the_tui_and_never_torch_at_module_level() -> None:
    # import-linter checks the same (test_layers); this also catches an import inside a function
    # (torch) and holds without the import graph. The glob must find the sources, or it proves nothing.
    paths = sorted((ROOT / "src" / "trainroom" / "core").rglob("*.py"))
    assert len(paths) > 50
    for path in paths:
        for mod, at_top in _imports(path):
            root = mod.split(".")[0]
            assert root not in ("textual", "rich") and not mod.startswith("trainroom.tui"), f"{path}: {mod}"
            if path.parent.name != "demo":
                assert not (root == "torch" and at_top), f"{path} imports torch at module level"


def test_the_wheel_installs_everything_under_trainroom(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    wheel = next(tmp_path.glob("trainroom-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"trainroom", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    for must in (
        "trainroom/__init__.py",
        "trainroom/core/keeper/loop.py",
        "trainroom/core/demo/corpus.txt",
        "trainroom/tui/__init__.py",
        "trainroom/themes/__init__.py",
    ):
        assert must in names
    assert any(n.startswith("trainroom/themes/") and n.endswith(".toml") for n in names)
    # The metadata's version is the one trainroom.__version__ says (pyproject reads it from there).
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert f"\nVersion: {trainroom.__version__}\n" in zipfile.ZipFile(wheel).read(meta).decode()
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "trainroom = trainroom.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()
