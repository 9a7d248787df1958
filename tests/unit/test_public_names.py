"""Every public name ever documented imports, each in a fresh interpreter: the names the README and
docs/*.md show today (their python blocks and inline code, read here) must import without a
DeprecationWarning; the older paths an earlier README documented still import and work, warn once,
and name the new path. `import trainroom` is the SDK and costs a trainer nothing it does not use."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import trainroom
from trainroom.core import sdk

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Paths an earlier README or docs page documented that are still current (no warning).
CURRENT = [
    "trainroom.core.sdk",
    "trainroom.core.sdk.reporter",  # `from trainroom.core.sdk import reporter`
    "trainroom.core.sdk.reporter.connect",
    "trainroom.core.sdk.lr.reimpose_lr",
    "trainroom.core.sdk.save.save_checkpoint",
    "trainroom.core.sdk.tracer.NonFiniteTracer",
    *(f"trainroom.core.sdk.{name}" for name in sdk.__all__),
    *(f"trainroom.{name}" for name in trainroom.__all__),
    "trainroom.core.wire.protocol.Hello",
    "trainroom.core.wire.protocol.Step",
    "trainroom.core.wire.protocol.frame",
    "trainroom.cli.main",
    "trainroom.integrations.hf.TrainroomCallback",
    "trainroom.integrations.lightning.TrainroomCallback",
]

# The paths the README documented before the SDK moved to trainroom.core.sdk (its public names read
# from the old modules: `git show 89865c0^:src/trainroom/core/<file>.py`), and the new path each
# one's warning must name.
DEPRECATED = {
    "trainroom.core.reporter": "trainroom.connect",
    **{
        f"trainroom.core.reporter.{n}": "trainroom.connect"
        for n in ("connect", "current", "Reporter", "NullReporter", "error_chain")
    },
    **{
        f"trainroom.core.lr.{n}": "trainroom.reimpose_lr"
        for n in ("reimpose_lr", "LrChange", "requested_from_argv")
    },
    "trainroom.core.tracer.NonFiniteTracer": "trainroom.NonFiniteTracer",
    # The wire protocol, documented at its module before core's single modules became packages.
    **{f"trainroom.core.protocol.{n}": "trainroom.core.wire.protocol" for n in ("Hello", "Step", "frame")},
    **{
        f"trainroom.core.checkpoints.{n}": "trainroom.save_checkpoint"
        for n in (
            "save_checkpoint",
            "latest_checkpoint",
            "verified_checkpoints",
            "CheckpointError",
            "CheckpointWontFit",
            "Saved",
            "VerifiedCheckpoint",
        )
    },
}

# Imports a dotted path (the longest importable module, then attributes) twice, and prints the
# trainroom DeprecationWarnings each time raised, and where the new name lives.
PROBE = r"""
import importlib, json, sys, warnings

def resolve(path):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as exc:
            if exc.name != ".".join(parts[:i]):
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)

def ours(caught):
    return [str(w.message) for w in caught
            if issubclass(w.category, DeprecationWarning) and "trainroom" in str(w.message)]

with warnings.catch_warnings(record=True) as first:
    warnings.simplefilter("always")
    obj = resolve(sys.argv[1])
with warnings.catch_warnings(record=True) as again:
    warnings.simplefilter("always")
    assert resolve(sys.argv[1]) is obj
print(json.dumps({"first": ours(first), "again": ours(again), "module": getattr(obj, "__module__", None)}))
"""


def _probe(path: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, path], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, f"{path} does not import:\n{done.stderr[-2000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict)
    return out


# ---------------------------------------------------------------------------- read from the docs

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"\b(trainroom(?:\.[A-Za-z_]\w*)+)")
FILE_SUFFIXES = {"toml", "md", "py", "json", "jsonl", "log", "txt", "yaml", "sock"}


def _bindings(tree: ast.AST) -> dict[str, str]:
    """name -> the trainroom path it was bound to, for every import of trainroom in a block."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "trainroom":
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else "trainroom"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trainroom":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _uses(tree: ast.AST, bound: dict[str, str]) -> set[str]:
    """`alias.name` for every attribute read off a name bound to a trainroom import."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            out.add(f"{bound[node.value.id]}.{node.attr}")
    return out


def documented(text: str) -> set[str]:
    """Every trainroom path one page documents: what its python blocks import and use (a later block
    may use a name an earlier one imported), and the dotted names in its inline code."""
    names: set[str] = set()
    bound: dict[str, str] = {}
    for lang, body in FENCE.findall(text):
        if lang.strip() not in ("python", "py"):
            continue
        tree = ast.parse(body)  # a documented block that does not parse is a bug of its own
        bound |= _bindings(tree)
        names |= set(_bindings(tree).values()) | _uses(tree, bound)
    prose = FENCE.sub("", text)
    for span in INLINE.findall(prose):
        for name in DOTTED.findall(span):
            if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                names.add(name)
        for alias, attr in re.findall(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)\(", span):
            if alias in bound:
                names.add(f"{bound[alias]}.{attr}")
    return names


def test_the_reader_finds_imports_uses_and_inline_names() -> None:
    page = (
        "Use `trainroom.core.sdk.save.save_checkpoint(s, n)`; settings in `trainroom.toml`.\n"
        "```python\nimport trainroom\nrep = trainroom.connect(lr=1)\n```\n"
        "```python\nfrom trainroom.core import sdk as s\nreq = s.replay_request()\n```\n"
        "then `s.replay_result(x)`.\n"
        "```text\ntrainroom.not.python\n```\n"
    )
    assert documented(page) == {
        "trainroom",
        "trainroom.connect",
        "trainroom.core.sdk",
        "trainroom.core.sdk.replay_request",
        "trainroom.core.sdk.replay_result",
        "trainroom.core.sdk.save.save_checkpoint",
    }


DOCUMENTED = sorted(set().union(*(documented(p.read_text()) for p in DOCS)))
# The older modules, named in the docs where they say these paths still work (and warn).
OLD_MODULES = (
    "trainroom.core.reporter",
    "trainroom.core.lr",
    "trainroom.core.tracer",
    "trainroom.core.checkpoints",
    "trainroom.core.protocol",
)


def _is_old(path: str) -> bool:
    return any(path == m or path.startswith(m + ".") for m in OLD_MODULES)


def test_every_older_path_the_docs_name_is_checked_as_one() -> None:
    named = [p for p in DOCUMENTED if _is_old(p)]
    assert [p for p in named if p not in DEPRECATED and p not in OLD_MODULES] == []
    assert all(any(d.startswith(m + ".") for d in DEPRECATED) for m in OLD_MODULES)


def test_the_docs_document_the_sdk_at_the_top() -> None:
    # Else the parametrized test below would prove nothing about today's README.
    assert {"trainroom", "trainroom.connect", "trainroom.save_checkpoint"} <= set(DOCUMENTED)


@pytest.mark.parametrize("path", sorted({p for p in DOCUMENTED if not _is_old(p)} | set(CURRENT)))
def test_a_documented_name_imports_without_a_deprecation(path: str) -> None:
    out = _probe(path)
    assert out["first"] == [] and out["again"] == [], out


@pytest.mark.parametrize("path", sorted(set(DEPRECATED) | {p for p in DOCUMENTED if _is_old(p)}))
def test_an_older_path_imports_warns_once_and_names_the_new_one(path: str) -> None:
    out = _probe(path)
    first, again = out["first"], out["again"]
    assert isinstance(first, list) and len(first) == 1, out
    new = DEPRECATED.get(path) or next(v for k, v in DEPRECATED.items() if k.startswith(path + "."))
    assert new in first[0], first[0]
    assert again == [], "warned twice"


def test_the_earlier_readme_snippet_still_runs(tmp_path: Path) -> None:
    """The README's first SDK lines, verbatim, in a trainer script: it runs (a no-op reporter
    outside a keeper), and the warning a user sees names the new import."""
    script = tmp_path / "train.py"
    script.write_text(
        "from trainroom.core import reporter\n"
        "import trainroom.core.checkpoints, trainroom.core.lr, trainroom.core.tracer\n"
        "import trainroom\n"
        "rep = reporter.connect(lr=3e-4, vocab_size=50257, warmup_steps=2000)\n"
        "rep.step(1, loss=2.5, tokens=128)\n"
        "assert reporter.connect is trainroom.connect\n"
        "assert trainroom.core.checkpoints.save_checkpoint is trainroom.save_checkpoint\n"
        "assert trainroom.core.lr.reimpose_lr is trainroom.reimpose_lr\n"
        "assert trainroom.core.tracer.NonFiniteTracer is trainroom.NonFiniteTracer\n"
        "print('ran', type(rep).__name__)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TRAINROOM_")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ran NullReporter"
    # Python's default filters show a DeprecationWarning raised by __main__'s own import line.
    assert "train.py:1: DeprecationWarning: trainroom.core.reporter is deprecated" in done.stderr
    assert "use `import trainroom` and trainroom.connect" in done.stderr


# ---------------------------------------------------------------------------- the package's top


def test_the_top_gives_every_sdk_name() -> None:
    assert sorted(set(trainroom.__all__) - {"__version__"}) == sorted(sdk.__all__)
    assert sorted(sdk.__all__) == sorted(sdk.WHERE)
    assert set(sdk.__all__) <= set(dir(trainroom)) and set(sdk.__all__) <= set(dir(sdk))
    with pytest.raises(AttributeError):
        _ = trainroom.no_such_name  # type: ignore[attr-defined]


HEAVY = ("textual", "rich", "torch", "trainroom.cli", "trainroom.core.cli", "trainroom.tui", "numpy")


def test_import_trainroom_and_connect_import_nothing_heavy() -> None:
    code = (
        "import sys, trainroom\n"
        "before = set(sys.modules)\n"
        "trainroom.connect, trainroom.current\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith({HEAVY!r})])\n"
        "print(sorted(m for m in before if m.startswith('trainroom')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('trainroom.core.ckpt')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    heavy, at_import, ckpt = done.stdout.strip().splitlines()
    assert heavy == "[]", f"the SDK pulled in {heavy}"
    assert at_import == "['trainroom']", f"`import trainroom` alone imported {at_import}"
    assert ckpt == "[]", f"connect pulled in the checkpoint code: {ckpt}"


def test_the_version_is_said_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "trainroom.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", trainroom.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog or f"## [{trainroom.__version__}]" in changelog
