"""Every control-room test keeps its settings (the theme `t` chose) in a state dir of its own,
never the person's: a test that presses `t` must not change the next session's theme. (A test
that asks for `trhome` gets that one instead: it is set after this.)"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_settings(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    return home
