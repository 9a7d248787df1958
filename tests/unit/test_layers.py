"""The architecture, checked: trainroom.core's and trainroom.tui's layers import one way, nothing imports in a circle
(function-level imports included), and each check is shown to fail on a planted bad import.

The layer map is the `[tool.importlinter]` contract in pyproject.toml (one source of truth); the
checks here walk grimp's import graph of the installed package, the same graph lint-imports reads.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "trainroom.core"
TUI = "trainroom.tui"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    assert isinstance(contracts, list)
    return contracts


def _layers(container: str = CORE) -> list[set[str]]:
    """A package's layers, highest first, each a set of subpackage/module names (no parentheses)."""
    (layers,) = [
        c["layers"] for c in _contracts() if c.get("type") == "layers" and c.get("containers") == [container]
    ]
    assert isinstance(layers, list)
    return [{name.strip().strip("()") for name in str(line).split("|")} for line in layers]


def _component(module: str, container: str = CORE) -> str | None:
    """`trainroom.core.run.state` -> `run`; None outside the container."""
    parts, top = module.split("."), container.split(".")
    if parts[: len(top)] != top or len(parts) <= len(top):
        return None
    return parts[len(top)]


def layer_violations(graph: grimp.ImportGraph, layers: list[set[str]], container: str = CORE) -> list[str]:
    """Every import from a lower layer into a higher one (or across a layer's siblings)."""
    rank = {name: i for i, line in enumerate(layers) for name in line}
    out = []
    for importer in sorted(graph.modules):
        a = _component(importer, container)
        if a not in rank:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            b = _component(imported, container)
            if b is None or b not in rank or a == b:
                continue
            if rank[b] < rank[a] or (rank[b] == rank[a]):
                out.append(f"{importer} -> {imported} ({a} may not import {b})")
    return out


def import_cycles(graph: grimp.ImportGraph, package: str = CORE) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), among the package's modules."""
    nodes = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {
        n: sorted(m for m in graph.find_modules_directly_imported_by(n) if m in set(nodes)) for n in nodes
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(sorted(scc))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(nodes)))
    for n in nodes:
        if n not in index:
            visit(n)
    return cycles


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # Type-checking imports count too: a circle through them is still a circle of the design.
    return grimp.build_graph("trainroom")


def test_the_graph_sees_the_whole_core(graph: grimp.ImportGraph) -> None:
    named = {c for line in _layers() for c in line}
    present = {_component(m) for m in graph.modules} - {None}
    assert named <= present, f"layers missing from the package: {named - present}"
    # Every subpackage and module of the core is in some layer.
    assert present - named == set(), "a core component that no layer names"


def test_core_layers_import_one_way(graph: grimp.ImportGraph) -> None:
    assert layer_violations(graph, _layers()) == []


def test_every_tui_module_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    named = {c for line in _layers(TUI) for c in line}
    present = {_component(m, TUI) for m in graph.modules} - {None}
    assert named <= present, f"layers missing from the package: {named - present}"
    assert present - named == set(), "a control-room module that no layer names"


def test_tui_layers_import_one_way(graph: grimp.ImportGraph) -> None:
    assert layer_violations(graph, _layers(TUI), TUI) == []


def test_a_planted_upward_import_in_the_tui_is_caught(graph: grimp.ImportGraph) -> None:
    planted = grimp.build_graph("trainroom")
    planted.add_import(importer="trainroom.tui.widgets.loss", imported="trainroom.tui.app")
    layers = _layers(TUI)
    found = set(layer_violations(planted, layers, TUI)) - set(layer_violations(graph, layers, TUI))
    assert found == {"trainroom.tui.widgets.loss -> trainroom.tui.app (widgets may not import app)"}


def test_no_import_circle_in_the_tui(graph: grimp.ImportGraph) -> None:
    assert import_cycles(graph, TUI) == []


def test_no_import_circle_anywhere_in_the_core(graph: grimp.ImportGraph) -> None:
    assert import_cycles(graph) == []


def test_a_planted_upward_import_is_caught(graph: grimp.ImportGraph) -> None:
    planted = grimp.build_graph("trainroom")
    planted.add_import(importer="trainroom.core.run.state", imported="trainroom.core.keeper.loop")
    found = set(layer_violations(planted, _layers())) - set(layer_violations(graph, _layers()))
    assert found == {"trainroom.core.run.state -> trainroom.core.keeper.loop (run may not import keeper)"}


def test_a_planted_circle_is_caught() -> None:
    planted = grimp.build_graph("trainroom")
    # keeper.loop imports keeper.actions; the reverse closes a circle inside one layer.
    planted.add_import(importer="trainroom.core.keeper.actions", imported="trainroom.core.keeper.loop")
    cycles = import_cycles(planted)
    assert any({"trainroom.core.keeper.actions", "trainroom.core.keeper.loop"} <= set(c) for c in cycles)


def test_lint_imports_keeps_every_contract() -> None:
    """import-linter itself, on the pyproject contracts (the core's layers, the TUI's layers, the
    TUI kept out of the core, the integrations above the trainer SDK only)."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.argv=['lint-imports']; lint_imports_command()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " 0 broken" in done.stdout.lower().split("contracts:")[-1], done.stdout[-2000:]
