"""The trainer's output can never kill it: its stdout and stderr go through a pipe the keeper's
output pump drains into trainer.log. A full state-dir disk (a real tmpfs) costs lines, counted and
said, never the trainer; the pump or the keeper killed leaves it printing. Every test drives a
real keeper and trainer."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import status
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import kill_runs_under, wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

# Instrumented (its steps are counted whatever happens to its output) and printing a line a step
# with plain print: a write error on stdout would end it with a traceback.
PRINTER = """
    import os, sys, time
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    step = 0
    while not os.path.exists(sys.argv[1]):
        step += 1
        rep.step(step, loss=2.0)
        print(f"step {step} loss 2.0 " + "." * 200)
        time.sleep(0.01)
    print(f"stopped at {step}")
"""


@pytest.fixture
def small_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TRAINROOM_HOME (the run dir and its trainer.log) on a 16 MiB tmpfs this test can fill."""
    with tmpfs("16m", prefix="trout") as home:
        monkeypatch.setenv("TRAINROOM_HOME", str(home))
        monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
        try:
            yield home
        finally:
            kill_runs_under(home)


def _launch(tmp_path: Path) -> tuple[runs.RunInfo, Path]:
    script = tmp_path / "printer.py"
    script.write_text(textwrap.dedent(PRINTER))
    stop = tmp_path / "stop"
    info = launch(
        [sys.executable, str(script), str(stop)],
        LaunchOptions(linger_s=120, ckpt_root=str(tmp_path / "ckpt")),
        cwd=str(tmp_path),
    )
    return info, stop


def _low(info: runs.RunInfo) -> dict[str, Any] | None:
    return next((f for f in status(info)["findings"] if f["code"] == "STATE_DISK_LOW"), None)


def _last_step_in_log(log: Path) -> int:
    if not log.exists():
        return 0
    lines = [ln for ln in log.read_bytes().decode(errors="replace").splitlines() if ln.startswith("step ")]
    return int(lines[-1].split()[1]) if lines else 0


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pump_pids(info: runs.RunInfo) -> list[int]:
    keeper = psutil.Process(runs.read_record(Path(info.run_dir)).keeper_pid)
    out = []
    for c in keeper.children():
        try:
            if (
                "trainroom.core.keeper.outpump" in " ".join(c.cmdline())
                and c.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(c.pid)
        except psutil.Error:
            continue  # gone, or a zombie not yet reaped: no pump
    return out


def test_a_full_state_disk_costs_the_printing_trainer_lines_never_its_life(
    small_home: Path, tmp_path: Path
) -> None:
    info, stop = _launch(tmp_path)
    log = Path(info.run_dir) / runs.LOG_NAME
    wait_for(lambda: _last_step_in_log(log) >= 20, timeout=60, what="lines in trainer.log")
    trainer = status(info)["pid"]
    filler = small_home / "filler"
    fill(filler)
    # The loss is said: how many bytes, that the trainer goes on.
    low = wait_for(
        lambda: (
            (f := _low(info)) and f["evidence"]["output_losing"] and f["evidence"]["output_lost_bytes"] and f
        ),
        timeout=60,
        what="STATE_DISK_LOW with the output being lost",
    )
    assert low["severity"] == "critical" and "bytes not written to trainer.log" in low["message"], low
    # ... and the trainer trains on, printing into a full disk.
    at_full = status(info)["step"]
    wait_for(lambda: status(info)["step"] >= at_full + 100, timeout=60, what="steps while the disk is full")
    grown = wait_for(
        lambda: (
            (f := _low(info))
            and f["evidence"]["output_lost_bytes"] > low["evidence"]["output_lost_bytes"]
            and f
        ),
        timeout=60,
        what="the lost count growing",
    )
    assert psutil.Process(trainer).status() != psutil.STATUS_ZOMBIE
    # Space returns: logging resumes by itself, with lines newer than the full disk.
    before_free = status(info)["step"]
    filler.unlink()
    wait_for(lambda: _last_step_in_log(log) > before_free, timeout=60, what="trainer.log written again")
    stop.touch()
    ended = wait_for(
        lambda: (s := status(info))["state"] in ("exited", "dead") and s, timeout=60, what="the trainer's end"
    )
    assert ended["state"] == "exited", ended
    # Its last line reached the file (the keeper may have taken its last step frame or not).
    last = log.read_text(errors="replace").rsplit("stopped at ", 1)
    assert len(last) == 2 and int(last[1].split()[0]) >= ended["step"], last[-1][-200:]
    notes = [
        r.message for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.KeeperNote)
    ]
    resumed = [n for n in notes if "reaches trainer.log again" in n]
    assert resumed, notes
    lost = int(resumed[-1].split(": ", 1)[1].split(" bytes")[0])
    assert lost >= grown["evidence"]["output_lost_bytes"]


def test_the_pump_or_the_keeper_killed_leaves_the_trainer_printing(trhome: Path, tmp_path: Path) -> None:
    info, stop = _launch(tmp_path)
    log = Path(info.run_dir) / runs.LOG_NAME
    wait_for(lambda: _last_step_in_log(log) >= 10, timeout=60, what="lines in trainer.log")
    trainer = psutil.Process(status(info)["pid"])
    # The pump killed: another takes over on the same pipe, nothing the trainer sees.
    (pump,) = wait_for(lambda: _pump_pids(info), timeout=30, what="the output pump")
    os.kill(pump, signal.SIGKILL)
    wait_for(lambda: [q for q in _pump_pids(info) if q != pump], timeout=30, what="a new pump")
    at = _last_step_in_log(log)
    wait_for(lambda: _last_step_in_log(log) >= at + 20, timeout=60, what="lines after the pump's death")
    # The keeper killed: its pump goes on draining, the trainer neither blocks nor gets EPIPE.
    (pump,) = _pump_pids(info)
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    os.kill(keeper, signal.SIGKILL)
    wait_for(lambda: _gone(keeper), what="the keeper's end")
    at = _last_step_in_log(log)
    wait_for(lambda: _last_step_in_log(log) >= at + 50, timeout=60, what="lines after the keeper's death")
    assert trainer.is_running() and trainer.status() != psutil.STATUS_ZOMBIE
    stop.touch()
    wait_for(
        lambda: "stopped at" in log.read_text(errors="replace"), timeout=60, what="the trainer's last line"
    )
    wait_for(lambda: _gone(pump), timeout=30, what="the pump's end with the pipe's")


# Uninstrumented: its steps are read from trainer.log only.
LOG_PRINTER = """
    import time
    step = 0
    while True:
        step += 1
        print(f"iter {step}: loss 2.0", flush=True)
        time.sleep(0.05)
"""


def test_a_log_renamed_away_is_written_anew_under_its_name_and_followed(trhome: Path, tmp_path: Path) -> None:
    """logrotate without copytruncate: trainer.log renamed, nothing created in its place. The
    pump writes the trainer's next lines to a new trainer.log, and the keeper's reader follows."""
    script = tmp_path / "printer.py"
    script.write_text(textwrap.dedent(LOG_PRINTER))
    info = launch([sys.executable, str(script)], LaunchOptions(linger_s=120), cwd=str(tmp_path))
    log = Path(info.run_dir) / runs.LOG_NAME
    wait_for(lambda: (status(info)["step"] or 0) >= 20, timeout=60, what="log steps")
    os.rename(log, log.with_name("trainer.log.1"))
    wait_for(
        lambda: log.exists() and "iter " in log.read_text(errors="replace"), timeout=60, what="a new log"
    )
    first_new = int(log.read_text(errors="replace").split("iter ", 1)[1].split(":")[0])
    d = wait_for(
        lambda: (s := status(info)) and (s["step"] or 0) >= first_new + 20 and s,
        timeout=60,
        what="steps read",
    )
    assert d["state"] == "running" and "STALLED" not in {f["code"] for f in d["findings"]}
