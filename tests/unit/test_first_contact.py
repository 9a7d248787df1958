"""First contact: the first `demo` makes TRAINROOM_HOME private (0700), so `status`
never warns about a directory trainroom made itself; `demo --help` names only themes `--theme`
takes; the demo's spike saves the checkpoint the documented `replay --step 31` replays from."""

from __future__ import annotations

import argparse
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainroom.core.demo.launcher import demo_command, demo_dir
from trainroom.core.run import store as runs
from trainroom.tui import theming


def test_the_first_demo_creates_the_state_dir_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "deep" / "home"
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    demo_dir()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert runs.state_dir_warning() is None
    runs.ensure_runs_dir()
    assert stat.S_IMODE((home / "runs").stat().st_mode) == 0o700
    # A state dir that exists keeps its own mode (a shared one is the user's choice, warned about).
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("TRAINROOM_HOME", str(shared))
    demo_dir()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755 and runs.state_dir_warning() is not None


def test_the_theme_remembered_first_creates_the_state_dir_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    assert theming.remember("trainroom-light") == ""
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_demo_help_names_only_themes_theme_takes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "demo", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    m = re.search(
        r"--theme NAME the control room's theme: (.+?), or one of yours in \$TRAINROOM_HOME/themes", said
    )
    assert m is not None, said
    names = [n.replace("(default)", "").strip() for n in m.group(1).split(",")]
    assert names == ["dark", "light", "contrast"]
    loaded = theming.load_themes(theming.default_dirs())
    for name in names:
        assert loaded.find(name) is not None, name


def _ns(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"fault": "spike", "fault_step": None, "steps": None, "forever": False}
    base |= {
        "lr": None,
        "step_delay": None,
        "ckpt_every": None,
        "tracer": False,
        "ranks": None,
        "device": "cpu",
    }
    return argparse.Namespace(**(base | kw))


def test_the_spike_demo_saves_the_checkpoint_its_documented_replay_starts_from() -> None:
    cmd = demo_command(_ns())
    assert cmd[cmd.index("--ckpt-every") + 1] == "10"  # step 30's checkpoint, before step 31
    cmd = demo_command(_ns(ckpt_every=25))
    assert cmd[cmd.index("--ckpt-every") + 1] == "25"  # what the user asks for wins
    assert "--ckpt-every" not in demo_command(_ns(fault="nan"))  # others keep the trainer's 50
