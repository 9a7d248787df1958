"""The history graphs against a real keeper and the real demo trainer, through Pilot: the keeper
journals the probe's figures (host RAM, page cache, the driver's VRAM, utilisation, power and
temperature through the fake NVML at the pynvml boundary, the run's CPU, disk free), and the
history survives closing and reopening the control room, while the keeper lives and after it is
gone (read from the journal then).

Every wait is a bound on something the keeper or the screen reports; nothing asserts how fast.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.helpers import run_cli, start_demo
from tests.support.tui_fakes import in_loop, screen_text
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol as p
from trainroom.tui.app import ControlRoom
from trainroom.tui.screens.history import HistoryScreen

pytestmark = pytest.mark.e2e
GIB = 1 << 30
START_S = 120.0
SCENARIO = {
    "devices": [
        {"name": "RTX 3060", "total_bytes": 12 * GIB, "used_bytes": 5 * GIB, "util_percent": 93,
         "power_w": 151.0, "temp_c": 67},
    ]
}  # fmt: skip


def _vitals(info: runs.RunInfo) -> list[p.Vitals]:
    return [r for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.Vitals)]


async def _history(run_id: str, least: int) -> tuple[int, str]:
    """Open the control room on the run, then its history (`H`), the whole run (`w` twice): the
    number of samples it draws (at least `least`) and the screen."""
    app = ControlRoom(run_id)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(3000):
            if app.state is not None:
                break
            await pilot.pause(0.05)
        await pilot.press("H")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        await pilot.press("w", "w")
        found = 0
        text = ""
        for _ in range(600):
            app.screen.redraw(force=True)  # type: ignore[attr-defined]
            await pilot.pause(0.05)
            text = screen_text(app)
            m = re.search(r"window: all \((\d+) samples", text)
            found = int(m.group(1)) if m else 0
            if found >= least:
                break
        await pilot.press("q")
    return found, text


@in_loop
async def test_the_history_survives_reopening_the_room_and_the_keepers_end(trhome: Path, monkeypatch) -> None:
    gpu = trhome / "nvml.json"
    write_scenario(gpu, SCENARIO)
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    info = start_demo(step_delay=0.05)
    wait_for(lambda: len(_vitals(info)) >= 3 or None, timeout=START_S, what="three journaled samples")
    first = _vitals(info)[0].v
    assert first.gpu_util_percent == 93 and first.gpu_power_w == 151.0 and first.gpu_temp_c == 67
    assert first.mem_used_bytes and first.page_cache_bytes is not None and first.disk_free_bytes

    n1, text = await _history(info.run_id, 3)
    assert n1 >= 3, text
    # (the demo itself drives the fake driver's figures as it allocates: the labels, then the
    # first sample's temperature, which nothing else writes)
    for label in ("host RAM used", "page cache", "VRAM (driver)", "GPU util", "GPU power", "GPU temp", "run CPU",
                  "disk free", "disk writes"):  # fmt: skip
        assert f" {label}  " in text, text
    assert "max 67 °C" in text, text
    assert "VRAM (allocator)" in text  # the demo reports its allocator (CPU: what it says, or why not)

    n2, text = await _history(info.run_id, n1)  # reopened while the keeper lives: the same and more
    assert n2 >= n1, text

    done = run_cli("kill", info.run_id, "--grace", "1", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    stopped = run_cli("stop-keeper", info.run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_for(lambda: not runs.resolve_run(info.run_id).alive or None, timeout=60, what="the keeper gone")
    journaled = len(_vitals(info))
    n3, text = await _history(info.run_id, journaled)  # from the journal alone
    assert n3 == journaled >= n2, text
