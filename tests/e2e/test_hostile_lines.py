"""Trainer output is hostile data: a real uninstrumented trainer prints 1 MiB lines of digits,
slashes, underscores and spaces, a 20 KB URL and a bracketed line of 60,000 spaces with no
newline (under the old 64 KiB cut, so it was re-read each tick), and is then SIGKILLed. The
keeper's tick stays prompt whatever it printed: `status` answers, the lines after the hostile
ones are still read, DEAD arrives (a generous deadline, not a timing of the fix) and the cut
lines are counted and said."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

from tests.support.helpers import codes, run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

HOSTILE = """
    import os, sys, time
    MiB = 1 << 20
    for step in range(1, 21):
        print(f"step {step} loss {2.0 - step * 0.01:.4f}", flush=True)
        time.sleep(0.02)
    for line in ("1" * MiB, "/" * MiB, "_" * MiB, " " * MiB + "x", "https://example.com/" + "a/b_c" * 4000):
        print(line, flush=True)
        time.sleep(0.3)  # under the reader's 4 MiB burst (past it the newest MiB is read alone)
    print("step 21 loss 1.7000", flush=True)
    time.sleep(0.3)
    sys.stdout.write("[" + " " * 60_000 + "]")  # no line end: killed with this line unfinished
    sys.stdout.flush()
    open(sys.argv[1], "w").close()
    time.sleep(3600)
"""


def test_a_trainer_printing_megabyte_lines_is_seen_dead_promptly(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(textwrap.dedent(HOSTILE))
    printed = tmp_path / "printed"
    info = launch([sys.executable, str(script), str(printed)], cwd=str(tmp_path))
    wait_for(printed.exists, timeout=120, what="the trainer printed its hostile lines")
    # The step printed after the hostile lines is read: they were cut, not a wedge.
    d = wait_for(lambda: (s := status(info))["step"] == 21 and s, timeout=60, what="step 21 read")
    assert d["loss"] == 1.7
    # `status` (a client of the keeper) answers while a 60,000-space line with no newline sits there.
    out = run_cli("status", info.run_id, "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    os.kill(d["pid"], signal.SIGKILL)
    dead = wait_for(
        lambda: (s := status(info))["state"] == "dead" and "DEAD" in codes(s) and s,
        timeout=10,
        what="DEAD after SIGKILL",
    )
    assert dead["exit"]["signal"] == "SIGKILL" or dead["exit"].get("signal") in (9, "KILL"), dead["exit"]
    out = run_cli("status", info.run_id, "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    notes = [
        r.message for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.KeeperNote)
    ]
    cut = [n for n in notes if "longer than 4 KiB" in n]
    # Said at the first, then counted at the end: 5 whole lines and the unfinished one.
    assert len(cut) == 2 and cut[0].startswith("1 line") and cut[-1].startswith("6 line"), notes
