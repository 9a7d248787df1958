"""The processes screen (`p`) as the real console script shows it in a real tmux pane, at 80x24
and at 160x48, against a real keeper and the real `demo --ranks 2` (torchrun, two CPU ranks):
every rank's pid is listed with its CPU %, RSS and command, the GPU columns say why they are
empty (no driver here) once, and Esc goes back to the room.

Nothing here is a fake; every wait is a bound on something the screen or `status` reports.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_tmux import Pane, _trainroom_script, pane_factory  # noqa: F401 (a fixture)
from tests.support.helpers import status
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs

pytestmark = pytest.mark.e2e
START_S = 240.0  # two ranks importing torch on a loaded 2-core machine


def _rank_pids() -> list[int]:
    def ready() -> list[int] | None:
        found = runs.list_runs()
        if len(found) != 1:
            return None
        rows = status(found[0])["ranks"]
        pids = [r["pid"] for r in rows if r.get("pid")]
        return pids if len(pids) == 2 else None

    pids: list[int] = wait_for(ready, timeout=START_S, what="both ranks' pids in status")
    return pids


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_tmux_p_lists_every_rank_with_cpu_rss_and_command(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811
    size: tuple[int, int],
) -> None:
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory(size)
    pane.start(f"{shlex.quote(script)} demo --ranks 2 --step-delay 0.05")
    pane.wait(" RUNNING ", timeout=START_S)
    pids = _rank_pids()
    pane.keys("p")
    pane.wait("processes of attempt 1:", timeout=30)

    def listed() -> str | None:
        text = pane.text()
        rows = {
            pid: re.search(rf"^\s*{pid}\s+(\d)\s+(\d+\.\d)\s+(\S+ [KMG]iB)\s", text, re.M) for pid in pids
        }
        return text if all(rows.values()) and "2 rank(s)" in text else None

    text = wait_for(listed, timeout=60, what=f"rank pids {pids} with rank, CPU % and RSS")
    assert "gpu columns:" in text and text.count("gpu columns:") == 1, text
    if size[0] >= 160:
        assert "trainroom.core.demo.train" in text, text  # the command, in full width
    else:
        pane.keys(*["l"] * 8)  # the command scrolls into sight
        pane.wait("trainroom.core.demo.train", timeout=30)
    pane.keys("Escape")
    pane.wait_gone("processes of attempt", timeout=30)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
