"""Trainer text is not believed blindly (real uninstrumented trainers under a real keeper):
- one `iter 999999999` line in a loop at step 40 is held, then dropped once the loop goes on
  from 41, and said; DEAD counts the steps the loop really reached;
- a traceback printed and handled at step 10 is not the cause of a SIGKILL at step 60;
- a `[rank3]:` prefix on a single process's traceback invents no rank 3, and a torchrun summary
  it printed invents no workers."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

from tests.support.helpers import codes, status
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

JUMPER = """
    import os, signal, sys, time, traceback
    for step in range(1, 61):
        print(f"step {step} loss {3.0 - step * 0.01:.4f}", flush=True)
        if step == 10:
            try:
                {}["shard"]
            except KeyError:
                traceback.print_exc()  # handled: training goes on
        if step == 40:
            print("iter 999999999: loss 2.0000", flush=True)  # someone else's counter
        time.sleep(0.03)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
"""

PREFIXED = """
    import sys, time
    for step in range(1, 21):
        print(f"step {step} loss {3.0 - step * 0.01:.4f}", flush=True)
        time.sleep(0.02)
    print(\"\"\"[rank3]: Traceback (most recent call last):
    [rank3]:   File "train.py", line 9, in <module>
    [rank3]: ValueError: bad batch
    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-06_06:00:00
      host      : node7
      rank      : 5 (local_rank: 5)
      exitcode  : -9 (pid: 4242)\"\"\", flush=True)
    sys.exit(1)
"""


def notes_of(info: runs.RunInfo) -> list[str]:
    journal = Path(info.run_dir) / runs.JOURNAL_NAME
    return [r.message for r in read_journal(journal) if isinstance(r, p.KeeperNote)]


def test_a_jump_and_a_handled_traceback_are_not_believed(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "jumper.py"
    script.write_text(textwrap.dedent(JUMPER))
    info = launch([sys.executable, str(script)], cwd=str(tmp_path))
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=120, what="dead")
    assert d["exit"]["signal"] == signal.SIGKILL
    assert d["step"] == 60
    dead = next(f for f in d["findings"] if f["code"] == "DEAD")
    assert "999999999" not in dead["message"] and "at step 60" in dead["message"], dead["message"]
    assert "KeyError" not in dead["message"] and "(no traceback)" in dead["message"], dead["message"]
    assert dead["evidence"]["cause_from"] == "the trainer's exit status"
    notes = notes_of(info)
    assert any("said step 999999999 right after step 40: not believed" in n for n in notes), notes
    assert any(
        "step 999999999 (after step 40) dropped: a later line went on from step 41" in n for n in notes
    )


def test_a_single_process_rank_prefix_and_printed_summary_invent_no_ranks(
    trhome: Path, tmp_path: Path
) -> None:
    script = tmp_path / "prefixed.py"
    script.write_text(textwrap.dedent(PREFIXED))
    info = launch([sys.executable, str(script)], cwd=str(tmp_path))
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=120, what="dead")
    assert d["exit"]["code"] == 1 and "DEAD" in codes(d)
    dead = next(f for f in d["findings"] if f["code"] == "DEAD")
    assert "(ValueError: bad batch)" in dead["message"], dead["message"]
    assert dead["evidence"]["rank"] is None and dead["evidence"]["worker"] is None
    assert dead["evidence"]["cause_from"] == "the last traceback in trainer.log after the attempt's last step"
    assert [r["rank"] for r in d["ranks"]] == [0], d["ranks"]
