"""A run is named on the command line by its id, a unique prefix or suffix of it, or the name it
was given (`launch --name`, `attach --name`: the id's middle), the newest run of that name."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run import store


def _run(name: str | None, argv: list[str] | None = None) -> str:
    _d, rec = store.create_run(argv or ["python", "train.py"], "/tmp", LaunchOptions(), name=name)
    time.sleep(0.01)  # created times apart: newest is well defined
    return rec.run_id


def test_a_run_is_found_by_its_name_the_newest_of_that_name(trhome: Path) -> None:
    old = _run("tourloop")
    other = _run("bar")
    new = _run("tourloop")
    assert store.run_name(new) == "tourloop" and store.run_name("not-an-id") is None
    assert store.resolve_run("tourloop").run_id == new != old
    assert store.resolve_run("bar").run_id == other
    assert store.resolve_run(old).run_id == old  # the full id still names the older one
    assert store.resolve_run(old[-4:]).run_id == old  # and a unique suffix
    spaced = _run("my run")
    assert store.resolve_run("my run").run_id == spaced  # the name as typed, or its slug
    script = _run(None, ["python", "fine_tune.py"])
    assert store.resolve_run("fine-tune").run_id == script  # no --name: named after its script
    with pytest.raises(store.RunError, match="unknown run 'nope'"):
        store.resolve_run("nope")
