"""What nvitop, btop and k9s users take for granted, as the real console script shows it in a real
tmux pane at 80x24 and 160x48, against a real keeper and the real demo trainer: the history graphs
(`H`) drawn from the journal's samples, the command line (`:`) carrying out a command as its key
does (`:runs`: the overview, its command column the script and its arguments, the worst finding in
sight), and `:` with a command that cannot be carried out saying why.

Nothing here is a fake; every wait is a bound on something the screen reports.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_tmux import Pane, _trainroom_script, pane_factory  # noqa: F401 (a fixture)
from tests.support.room import START_S

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_tmux_history_and_the_command_line(
    trhome: Path,
    pane_factory: Callable[[tuple[int, int]], Pane],  # noqa: F811
    size: tuple[int, int],
) -> None:
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory(size)
    pane.start(f"{shlex.quote(script)} demo --fault hang --fault-step 40 --step-delay 0.05")
    pane.wait(" RUNNING ", timeout=START_S)
    pane.keys("H")
    text = pane.wait("› history · 5 min", "host RAM used", timeout=60)  # the first sample: within 5 s
    assert "GPU util · power · temp · VRAM (driver): —" in text, text  # no driver here: said once
    pane.keys("w")
    pane.wait("history · 1 h", timeout=30)
    pane.keys("Escape")
    pane.wait_gone("› history", timeout=30)

    pane.wait(" HUNG ", timeout=START_S)
    pane.keys(":")
    pane.wait("tab: complete", timeout=30)
    pane.keys("r", "u", "n", "s", "Enter")
    text = pane.wait("runs: 1, 1 live", timeout=30)
    row = next(line for line in text.splitlines() if "HUNG" in line and "train-" in line)
    assert row.count("HUNG") >= 2, text  # the state, and the worst finding right beside it at 80
    assert "—" in row, row  # no steps/s for a hung run (its step, loss and finding are figures)
    if size[0] >= 160:
        assert "trainroom.core.demo.train --" in text and "python" not in row, text
    pane.keys("Escape")
    pane.wait_gone("runs: 1, 1 live", timeout=30)
    pane.keys(":")
    pane.wait("tab: complete", timeout=30)
    pane.keys("p", "r", "u", "n", "e", " ", "k", "e", "e", "p", " ", "x", "Enter")
    # The Args type says why, as the CLI does (the toast wraps at 80 columns: its start is enough).
    pane.wait(":prune keep x: keep:", *(["expected a whole number"] if size[0] >= 160 else []), timeout=30)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
