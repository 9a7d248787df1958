"""Hostile checkpoints verified in bounded time: a pickle of shared references (the "billion
laughs": 30 levels of a list holding the list below it twice, 2^30 paths to one tensor in a file
of under 2 KB) is walked once per container, and a walk past its budget is cut short and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from trainroom.core.ckpt import inventory


def _laughs(levels: int = 30) -> object:
    t = torch.ones(4)
    node: object = [t]
    for _ in range(levels):
        node = [node, node]
    return {"model": {"w": torch.zeros(3, 3)}, "laughs": node}


def test_a_pickle_of_shared_references_is_verified_in_bounded_time(tmp_path: Path) -> None:
    f = tmp_path / "laughs.pt"
    torch.save(_laughs(), f)
    assert f.stat().st_size < 4096
    # A walk of every path would take days; once per container it is instant. The subprocess
    # bound only keeps a regression from hanging the suite.
    out = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "verify", str(f), "--json", "--no-discover"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["ok"] and rep["tensors"] == 2, rep
    assert "30 container(s) reached again through shared references: each walked once" in " ".join(
        rep["notes"]
    )


def test_the_walk_visits_each_container_once_and_yields_tied_tensors_under_both_names() -> None:
    w = torch.zeros(2, 2)
    state = {"wte.weight": w, "lm_head.weight": w}
    assert [n for n, _ in inventory.walk(state, "")] == ["wte.weight", "lm_head.weight"]
    walker = inventory.walk(_laughs(30), "")
    names = [n for n, _ in walker]
    assert names == ["model.w", "laughs.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0"]
    assert walker.shared == 30 and walker.cut_short is None


def test_a_walk_past_its_budget_is_cut_short_and_the_file_is_rejected_with_the_reason(tmp_path: Path) -> None:
    walker = inventory.walk({"ids": list(range(1000)), "w": torch.ones(1)}, "", budget=100)
    assert list(walker) == [] and walker.cut_short is not None
    assert "walked 100 entries and stopped" in walker.cut_short

    f = tmp_path / "wide.pt"
    torch.save({"model": {"w": torch.ones(2)}, "ids": list(range(50))}, f)
    from trainroom.core.ckpt import verify as verify_mod

    old = inventory.WALK_BUDGET
    try:
        inventory.WALK_BUDGET = 20
        rep = verify_mod.verify(f)
    finally:
        inventory.WALK_BUDGET = old
    assert not rep.ok and rep.reason is not None and rep.reason.startswith("not verified: walked 20 entries")
