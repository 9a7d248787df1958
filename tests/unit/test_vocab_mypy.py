"""mypy (the repository's strict configuration) rejects a misspelt run state, finding code,
checkpoint state, action name or checkpoint kind wherever one is written, and accepts the right spelling."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """\
from pathlib import Path

from trainroom.core.wire import protocol as p
from trainroom.core.ckpt import targets
from trainroom.core.findings import Finding
from trainroom.core.run.state import RunState


def check(run: RunState) -> bool:
    p.RunStatus(t=0.0, state="{state}")
    Finding(code="{code}", severity="warning", message="")
    p.CheckpointState(path="x", step=None, state="{ckpt}", t=0.0)
    Finding(code="DEAD", severity="critical", message="", action="{action}")
    a = targets.kind_of(Path(".")) == "{kind}"
    b = run.status == "{status}"
    return a and b
"""
RIGHT = {
    "state": "running",
    "code": "LOSS_SPIKE",
    "ckpt": "verified",
    "action": "resume",
    "kind": "hf-checkpoint",
    "status": "stopped",
}
WRONG = {
    "state": "runing",
    "code": "LOSS_SPIK",
    "ckpt": "verifyed",
    "action": "resme",
    "kind": "hf-checkpont",
    "status": "stoped",
}
LINE = {"state": 10, "code": 11, "ckpt": 12, "action": 13, "kind": 14, "status": 15}


def _mypy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, words: dict[str, str]) -> list[tuple[int, str]]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET.format(**words))
    # This checkout's sources, whatever an installed trainroom points at; the cache the quality
    # check's mypy run leaves makes this a fraction of a second.
    monkeypatch.setenv("MYPYPATH", str(ROOT / "src"))
    out, err, _rc = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            str(snippet),
        ]
    )
    assert "snippet.py" in out or "Success" in out, out + err
    return [(int(m[1]), m[2]) for m in re.finditer(r"snippet\.py:(\d+): error: (.*)", out)]


def test_mypy_rejects_each_misspelt_word_and_accepts_the_right_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _mypy(tmp_path, monkeypatch, RIGHT) == []
    errors = _mypy(tmp_path, monkeypatch, WRONG)
    assert sorted(line for line, _ in errors) == sorted(LINE.values()), errors
    for what, line in LINE.items():
        (msg,) = [m for n, m in errors if n == line]
        assert WRONG[what] in msg, (what, msg)
