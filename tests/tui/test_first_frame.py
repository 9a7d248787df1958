"""The control room's first frame loads only what it draws: the console script, the room and a
live run's state from its real keeper, without the screens a key opens later (the runs overview,
help, a finding's detail, confirmation, result, history, options, processes, search, the command
line, with Textual's DataTable and Input behind them), torch, NVML, the exporter or the keeper's
own side. Checked by `sys.modules` in a fresh interpreter, never by time: the wall time is
measured by `scripts/bench_first_frame.py` in a real tmux pane."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.screen import Screen

from tests.support.tui_fakes import dead_run_records, in_loop, make_app, settle
from tests.support.waiting import wait_for
from trainroom.cli import loading_quietly
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.tui.app import ControlRoom

HEAVY = (
    "torch",
    "numpy",
    "pynvml",
    "prometheus_client",
    "http.server",
    "urllib.request",
    "trainroom.core.keeper",
    "trainroom.core.notify",
    "trainroom.core.remote.ssh",
    "trainroom.core.demo",
    "trainroom.tui.screens.runs",
    "trainroom.tui.screens.help",
    "trainroom.tui.screens.finding",
    "trainroom.tui.screens.confirm",
    "trainroom.tui.screens.result",
    "trainroom.tui.screens.history",
    "trainroom.tui.screens.options",
    "trainroom.tui.screens.processes",
    "trainroom.tui.screens.search",
    "trainroom.tui.screens.cmdline",
    "trainroom.tui.history",
    "trainroom.tui.proctable",
    "textual.widgets._data_table",
)

# The console script's modules and the room's, then the room headless until the run's state is
# on screen (its header: the run id, RUNNING, its step); then `?` (the help), which must load.
FIRST_FRAME = r"""
import asyncio, json, sys, time
import trainroom.cli, trainroom.tui.entry
from trainroom.tui.app import ControlRoom
from trainroom.tui.widgets.header import RunHeader

heavy, run_id = json.loads(sys.argv[1]), sys.argv[2]
def loaded():
    return sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))

async def go():
    app = ControlRoom(run_id)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 120
        header = ""
        while not (run_id in header and "RUNNING" in header and "step 3" in header):
            if time.monotonic() > deadline:
                raise SystemExit(f"no state drawn in 120 s: {header!r}")
            await pilot.pause(0.05)
            header = str(app.query_one(RunHeader).render())
        at_first_frame = loaded()
        await pilot.press("question_mark")
        await pilot.pause()
        print(json.dumps({"first": at_first_frame, "help": loaded(), "screen": type(app.screen).__name__}))

asyncio.run(go())
"""

TRAINER = """
import time, trainroom
rep = trainroom.connect()
for step in (1, 2, 3):
    rep.step(step, loss=2.0 / step)
time.sleep(300)
"""


def test_the_first_frame_of_a_live_run_loads_no_screen_and_nothing_heavy(trhome: Path) -> None:
    info = launch([sys.executable, "-c", TRAINER], LaunchOptions(linger_s=0), cwd=str(trhome))

    def at_step_3() -> bool:
        st = runs.load_state(info.run_dir)
        return st.attempt is not None and st.steps_total >= 3

    wait_for(at_step_3, timeout=120, what="the trainer's third step in the journal")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", FIRST_FRAME, json.dumps(HEAVY), info.run_id],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TRAINROOM_FAKE_NVML": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] == [], (
        f"loaded before the first frame: {out['first']} ({time.monotonic() - t0:.1f} s)"
    )
    # The probe sees a screen once its key opens it: the help, loaded then and not before.
    assert out["screen"] == "HelpScreen"
    assert "trainroom.tui.screens.help" in out["help"]


def test_the_room_loads_with_no_collection_then_freezes_what_it_loaded() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        gc.unfreeze()
        with loading_quietly():
            assert not gc.isenabled()
            loaded = [object() for _ in range(10)]
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert len(loaded) == 10
        gc.disable()  # one who turned collection off keeps it off
        with loading_quietly():
            pass
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


def _looks(app: ControlRoom) -> tuple[object, ...]:
    """The screen's classes, each widget's colours, borders and place (scroll aside)."""
    widgets = [
        (w.id, sorted(w.classes), str(w.styles.background), str(w.styles.border), tuple(w.virtual_region))
        for w in app.screen.walk_children(with_self=True)
    ]
    return sorted(app.screen.classes), widgets


@pytest.mark.parametrize("size", [(80, 24), (119, 35), (120, 36), (160, 48)])
@in_loop
async def test_the_first_screen_opens_with_the_classes_its_size_gives(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    # Set before the panels are styled, so that Textual's first Resize changes none and styles
    # nothing again; the room then looks as one whose classes that Resize set.
    opened, _, _ = make_app(str(tmp_path), dead_run_records())
    first: list[set[str]] = []
    made = opened.get_default_screen

    def remember() -> Screen[object]:
        screen = made()
        first.append(set(screen.classes))
        return screen

    opened.get_default_screen = remember  # type: ignore[method-assign]
    async with opened.run_test(size=size) as pilot:
        await settle(opened, pilot)
        assert first == [set(opened.screen.classes)] and first[0]
        want = _looks(opened)
    plain, _, _ = make_app(str(tmp_path), dead_run_records())
    plain.get_default_screen = lambda: Screen(id="_default")  # type: ignore[method-assign]
    async with plain.run_test(size=size) as pilot:
        await settle(plain, pilot)
        assert _looks(plain) == want
