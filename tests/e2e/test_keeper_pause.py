"""A keeper that was itself stopped (SIGSTOP, a debugger, swap) judges its trainer on what the
trainer did, not on its own gap: no HUNG, STALLED or SLOW raised, journaled or delivered for the
time the keeper did not run. A real keeper, trainer and webhook receiver."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

from tests.support.helpers import status
from tests.support.receiver import receiver
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions, NotifyOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

# Steps every 50 ms and writes its step to a file: the test sees it go on while the keeper is stopped.
STEPPER = """
    import os, sys, time
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        if step % 10 == 0:
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(0.05)
"""

JUDGED = {"HUNG", "STALLED", "SLOW"}


def _trainer_step(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_a_paused_keeper_raises_and_delivers_no_hung_or_slow_for_its_own_gap(
    trhome: Path, tmp_path: Path
) -> None:
    # A short stall floor: a pause of a few seconds is far past it.
    (tmp_path / "trainroom.toml").write_text("[thresholds]\nstall_floor_s = 2.0\n")
    script = tmp_path / "stepper.py"
    script.write_text(textwrap.dedent(STEPPER))
    progress = tmp_path / "progress"
    with receiver() as rx:
        info = launch(
            [sys.executable, str(script), str(progress)],
            LaunchOptions(linger_s=120, notify=NotifyOptions(webhook=[rx.url("/hook")], min_severity="info")),
            cwd=str(tmp_path),
        )
        wait_for(lambda: (status(info)["step"] or 0) >= 60, timeout=90, what="a baseline of steps")
        keeper = runs.read_record(Path(info.run_dir)).keeper_pid
        os.kill(keeper, signal.SIGSTOP)
        try:
            # The trainer steps on for 6 s (120 steps) while its keeper does not run at all.
            at = _trainer_step(progress)
            wait_for(lambda: _trainer_step(progress) >= at + 120, timeout=90, what="the trainer stepping on")
        finally:
            os.kill(keeper, signal.SIGCONT)
        resumed = _trainer_step(progress)
        # The keeper catches up, and keeps judging afterwards.
        wait_for(
            lambda: (status(info)["step"] or 0) >= resumed + 60, timeout=90, what="steps after the pause"
        )
        d = status(info)
        assert d["state"] == "running", d
        recs = list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))
        raised = [r.finding.code for r in recs if isinstance(r, p.FindingRaised)]
        assert not JUDGED & set(raised), raised
        states = [r.state for r in recs if isinstance(r, p.RunStatus)]
        assert not {"hung", "stalled", "slow"} & set(states), states
        delivered = [b.json() for b in rx.got("/hook")]
        assert not [b for b in delivered if any(code in str(b) for code in JUDGED)], delivered
        notes = [
            r.message
            for r in recs
            if isinstance(r, p.KeeperNote) and "keeper itself did not run for" in r.message
        ]
        assert notes, "the keeper's own stall is said"
