"""The control room as the real console script in a real tmux pane (80x24 and 160x48), against a
real keeper and the real demo trainer (CPU torch): what a user sees and types, read back with
`capture-pane` (and its colours with `capture-pane -e`).

Nothing here is a fake. Every wait is a generous bound on something the screen or the keeper
reports (torch starts slowly on a loaded 2-core machine); no test asserts how fast anything was.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.helpers import status_json
from tests.support.room import CKPT_EVERY, FAULT_STEP, START_S, dead_with_checkpoint
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs
from trainroom.tui import theming

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed: no real terminal"
)

_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def badge_background(line: str, word: str) -> str | None:
    """The background colour (`r;g;b`) the pane shows under `word` in a captured line: the last
    `48;2;r;g;b` set before it (colour codes are kept until a reset)."""
    at = line.find(word)
    if at < 0:
        return None
    bg: str | None = None
    for m in _SGR.finditer(line[:at]):
        params = m.group(1).split(";")
        if params in ([""], ["0"]) or "49" in params:
            bg = None
        for i, v in enumerate(params):
            if v == "48" and params[i + 1 : i + 2] == ["2"]:
                bg = ";".join(params[i + 2 : i + 5])
    return bg


def theme_rgb(variable: str) -> str:
    """A colour of the default theme (trainroom-dark) as `r;g;b`."""
    from rich.color import Color

    theme = theming.load_themes(theming.default_dirs()).find("trainroom-dark")
    assert theme is not None
    r, g, b = Color.parse(theme.variables[variable]).get_truecolor()
    return f"{r};{g};{b}"


def _trainroom_script() -> str | None:
    near = Path(sys.executable).with_name("trainroom")
    return str(near) if near.exists() else shutil.which("trainroom")


def _then_stay(command: str, size: tuple[int, int]) -> str:
    """The command, once the terminal has its size, then its exit status printed, then a sleep:
    the pane stays to be read. Under pytest the pane's environment carries COLUMNS=80 LINES=24,
    which Textual prefers to the terminal's own size (a 160x48 pane drew an 80x24 screen): they
    are unset. tmux may also make a window at its default size and resize it a moment later."""
    w, h = size
    sized = f'unset COLUMNS LINES; while [ "$(stty size)" != "{h} {w}" ]; do sleep 0.1; done; '
    return "sh -c " + shlex.quote(sized + command + '; echo "[control room closed: $?]"; exec sleep 600')


class Pane:
    """A detached tmux session on a private socket, read with capture-pane."""

    def __init__(self, home: Path, size: tuple[int, int]) -> None:
        self.sock = str(home / "tmux.sock")
        self.size = size
        self.target = "room"

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", self.sock, *args],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, f"tmux {args}: {out.stderr}"
        return out.stdout

    def start(self, command: str) -> None:
        w, h = self.size
        # The shell stays after the control room closes, so the pane (and its last words) remain.
        self.tmux(
            "new-session",
            "-d",
            "-s",
            "room",
            "-x",
            str(w),
            "-y",
            str(h),
            "-e",
            f"TRAINROOM_HOME={os.environ['TRAINROOM_HOME']}",
            # 24-bit colour: tmux keeps the RGB an application sets, and capture-pane -e gives it.
            "-e",
            "COLORTERM=truecolor",
            _then_stay(command, self.size),
        )
        # Windows made later take this size too (a detached server's default is 80x24).
        self.tmux("set-option", "-g", "default-size", f"{w}x{h}")
        self.target = "room"

    def new_window(self, command: str) -> None:
        self.tmux(
            "new-window",
            "-t",
            "room",
            "-n",
            "again",
            "-e",
            f"TRAINROOM_HOME={os.environ['TRAINROOM_HOME']}",
            "-e",
            "COLORTERM=truecolor",
            _then_stay(command, self.size),
        )
        self.target = "room:again"

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.target)

    def escapes(self) -> str:
        """The pane with its colours: SGR sequences as the application set them (-e)."""
        return self.tmux("capture-pane", "-p", "-e", "-t", self.target)

    def pane_size(self) -> tuple[int, int]:
        w, h = self.tmux("display-message", "-p", "-t", self.target, "#{pane_width} #{pane_height}").split()
        return int(w), int(h)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.target, *keys)

    def wait(self, *needles: str, timeout: float = START_S) -> str:
        last = [""]

        def there() -> str | None:
            last[0] = self.text()
            return last[0] if all(n in last[0] for n in needles) else None

        try:
            return wait_for(there, timeout=timeout, interval=0.25, what=f"{needles} in the pane")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- pane ---\n{last[0]}") from None

    def wait_gone(self, needle: str, timeout: float = 30.0) -> str:
        """Until `needle` has left the pane: a modal closed. (Keys sent while it closes could
        reach the app glued to an Escape, which a terminal reads as Alt+key.)"""
        last = [""]

        def gone() -> str | None:
            last[0] = self.text()
            return last[0] if needle not in last[0] else None

        try:
            return wait_for(gone, timeout=timeout, interval=0.25, what=f"{needle!r} to leave the pane")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- pane ---\n{last[0]}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


def running_attempt(pane: Pane, run_id: str, n: int) -> str:
    """The pane once attempt `n` runs: the badge, and the trainer panel with its pid. (At 80
    columns the header drops "attempt 2/2" first when it names an open finding, such as the
    demo's DISK_FULL_SOON, so the attempt is read from the keeper and its pid from the pane.)"""
    s = wait_for(
        lambda: (s := status_json(run_id))["attempt"] == n and s["state"] == "running" and s,
        timeout=60,
        what=f"attempt {n} running",
    )
    return pane.wait(" RUNNING ", f"pid {s['pid']} ", timeout=60)


@pytest.fixture
def pane_factory(trhome: Path) -> Iterator[Callable[[tuple[int, int]], Pane]]:
    panes: list[Pane] = []

    def make(size: tuple[int, int]) -> Pane:
        panes.append(Pane(trhome, size))
        return panes[-1]

    try:
        yield make
    finally:
        for p in panes:
            p.close()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_tmux_demo_dead_resume_quit_reopen_kill(
    trhome: Path, pane_factory: Callable[[tuple[int, int]], Pane], size: tuple[int, int]
) -> None:
    """`trainroom demo --fault silent-death` in a real terminal: DEAD appears on a red badge, R +
    y starts attempt 2, q leaves the run going and says so, `trainroom watch` reopens it, Tab
    reaches the log (zoomed where the layout has no room), the runs overview lists the run,
    ctrl+k + y kills attempt 2 and shows the evidence."""
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory(size)
    pane.start(
        f"{shlex.quote(script)} demo --fault silent-death --fault-step {FAULT_STEP} "
        f"--ckpt-every {CKPT_EVERY} --step-delay 0.02 --forever"  # attempt 2 still runs at the kill
    )
    pane.wait(" DEAD ")
    assert pane.pane_size() == size
    assert max(len(line) for line in pane.text().splitlines()) > size[0] - 10  # drawn to the edge
    (info,) = runs.list_runs()
    d = dead_with_checkpoint(info)
    header = pane.escapes().splitlines()[0]
    assert badge_background(header, " DEAD ") == theme_rgb("trainroom-state-dead"), header

    pane.keys("R")
    # (at 24 rows the details scroll: the question, the headline and the buttons are what shows)
    pane.wait("Resume the run as a new attempt?", "starts attempt 2 from", "yes, resume (y)", timeout=60)
    pane.keys("y")
    text = pane.wait("resume: done", "before → after", "esc / enter: close")
    assert re.search(r"attempt\s+1\s+→\s+2", text), text
    pane.keys("Escape")
    pane.wait_gone("resume: done")
    text = running_attempt(pane, info.run_id, 2)
    assert text.splitlines()[0].startswith(" trainroom ")
    assert all(len(line) <= size[0] for line in text.splitlines())

    pane.keys("q")
    text = pane.wait("[control room closed: 0]", timeout=30)
    # Quitting says the run goes on, and how to come back to it or stop it.
    said = [" ".join(line.split()) for line in text.splitlines()]
    assert any(f"run {info.run_id} goes on (attempt 2" in line for line in said), text
    assert f"reattach: trainroom watch {info.run_id}" in said, text
    assert f"stop it: trainroom kill {info.run_id}" in said, text
    # The run lives on without its control room: the CLI sees attempt 2 still stepping.
    first = status_json(info.run_id)
    assert first["keeper"] == "alive" and first["attempt"] == 2 and first["state"] == "running", first
    wait_for(
        lambda: (status_json(info.run_id)["step"] or 0) > (first["step"] or 0),
        timeout=60,
        what="steps after the control room closed",
    )
    assert first["attempts"][1]["resume_from"] == d["latest_checkpoint"]

    pane.new_window(f"{shlex.quote(script)} watch {info.run_id}")
    assert pane.pane_size() == size
    running_attempt(pane, info.run_id, 2)
    # Tab to the trainer log: zoomed at 24 rows (no room for it), in its place at 48.
    pane.keys("BTab")  # (the log is last in Tab's order: shift+Tab goes round to it)
    text = pane.wait("trainer.log", "iter ", timeout=30)
    pane.keys("o")
    pane.wait("runs: 1, 1 live", info.run_id, "RUNNING", timeout=30)
    pane.keys("Escape")
    pane.wait_gone("runs: 1, 1 live")
    pane.keys("Escape")  # (out of the zoom, where there was one)
    pane.keys("C-k")
    pane.wait(
        "Kill the trainer's process group?",
        f"kills process group {first['pgid']}",
        f"pid {first['pid']}",
        "yes, kill (y)",
        timeout=60,
    )
    pane.keys("y")
    text = pane.wait("kill: done", "before → after", "esc / enter: close", timeout=60)
    assert re.search(r"processes\s+1\s+→\s+0", text) and re.search(
        rf"pids\s+{first['pid']}\s+→\s+none", text
    ), text
    pane.keys("Escape")
    pane.wait_gone("kill: done")
    after = wait_for(
        lambda: (s := status_json(info.run_id))["state"] == "stopped" and s,
        timeout=30,
        what="attempt 2 ended by the kill",
    )
    pane.wait(" STOPPED ", timeout=30)  # (the badge said RUNNING before the kill)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
    assert after["keeper"] == "alive" and after["attempt"] == 2
    assert after["attempts"][1]["exit_signal"] is not None


def test_tmux_a_finding_turns_the_running_badge_red_and_is_named(
    trhome: Path, pane_factory: Callable[[tuple[int, int]], Pane]
) -> None:
    """`trainroom demo --fault nan` at 80x24: the run keeps stepping (RUNNING) with NONFINITE
    open; the badge takes the critical colour (read from capture-pane -e) and the header names
    the finding, where it used to stay green."""
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory((80, 24))
    pane.start(f"{shlex.quote(script)} demo --fault nan --fault-step 15 --step-delay 0.05")
    pane.wait(" RUNNING ")
    green = badge_background(pane.escapes().splitlines()[0], " RUNNING ")
    assert green == theme_rgb("trainroom-state-running")
    text = pane.wait(" RUNNING  NONFINITE", timeout=START_S)
    header = pane.escapes().splitlines()[0]
    assert badge_background(header, " RUNNING ") == theme_rgb("trainroom-state-dead"), header
    assert "CRIT NONFINITE" in text  # the findings list says it too
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
