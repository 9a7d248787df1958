"""The panels as the real console script shows them in a real tmux pane at 80x24, against a real
keeper and the real demo trainer (CPU torch): the numbered borders, the key strip keeping the keys
that move, the VRAM title with its "(fake)" and the zoomed process table, a number key and the
zoom, the help a key a line, the theme `t` chose kept for the next session, and a hung trainer
said hung with the last step's age (not "running" beside a stale rate).

Nothing here is a fake but the NVML boundary the ghost-memory demo drives. Every wait is a bound
on something the screen reports; no test asserts how fast anything was.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_tmux import Pane, _trainroom_script, pane_factory  # noqa: F401 (a fixture)
from tests.support.room import START_S
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def strip_entries(text: str) -> list[str]:
    return [e for e in text.splitlines()[-1].strip().split("  ") if e]


def test_tmux_80x24_panels_strip_vram_zoom_help_and_the_kept_theme(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811
) -> None:
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory((80, 24))
    pane.start(f"{shlex.quote(script)} demo --fault ghost-memory --step-delay 0.05")
    text = pane.wait(" RUNNING ", "(fake)", timeout=START_S)
    for mark in ("¹findings", "²trainer", "³VRAM", "⁴cadence", "⁶loss"):
        assert mark in text, text
    assert "³VRAM 12.0 GiB · RTX 3060 (fake)" in text, text  # the end of the name is kept
    entries = strip_entries(text)
    assert {"tab panels", "/ search", "o runs", "z zoom"} <= set(entries), entries
    assert entries[-2:] == ["? help", "q quit"], entries

    pane.keys("3")
    pane.keys("z")
    text = pane.wait("whose", "● this run", timeout=30)
    assert re.search(r"^\s+\d+\s+\S+ [GM]iB  ● this run", text, re.M), text
    pane.keys("z")
    pane.wait_gone("whose")

    pane.keys("0")  # the log: no room for it at 24 rows, so zoomed
    pane.wait("trainer.log", timeout=30)
    pane.keys("z")
    text = pane.wait("¹findings", "³VRAM", timeout=30)

    pane.keys("?")
    text = pane.wait("trainroom keys", "act on the run", timeout=30)
    rows = [line for line in text.splitlines() if re.search(r"(ready|not now:)", line)]
    assert len(rows) >= 6, text  # every action a line, with whether it can act now
    pane.keys("Escape")
    pane.wait_gone("trainroom keys")

    pane.keys("t")
    pane.wait("theme: light", timeout=30)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
    assert json.loads((trhome / "control-room.json").read_text()) == {"theme": "light"}


def test_tmux_a_hung_trainer_is_said_hung_with_the_age_of_its_last_step(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811
) -> None:
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory((80, 24))
    pane.start(f"{shlex.quote(script)} demo --fault hang --fault-step 20 --step-delay 0.05")
    text = pane.wait(" HUNG ", "hung: last step", "HUNG  was ", timeout=START_S)
    trainer = [line[:40] for line in text.splitlines()[2:5]]
    assert not any("running" in line for line in trainer), text
    first = re.search(r"hung: last step (.+?) ago", text)
    assert first is not None, text
    # The age moves on with the clock: a later screen says another one.
    age = first.group(1)

    def moved() -> bool:
        m = re.search(r"hung: last step (.+?) ago", pane.text())
        return m is not None and m.group(1) != age

    wait_for(moved, timeout=30, what="the last step's age moving on")
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
