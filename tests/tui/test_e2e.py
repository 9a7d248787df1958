"""The control room against a real keeper and a real demo trainer (CPU torch): in-process through
Textual's Pilot, and as the real console script in a real tmux pane.

Nothing here is a fake: the keeper, the trainer, its SIGKILL, the resume and the kill are real.
Every wait is a generous bound on something the keeper or the screen reports (torch starts slowly
on a loaded 2-core machine); no test asserts how fast anything happened.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import start_demo, status, status_json
from tests.support.tui_fakes import in_loop, screen_text
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs
from trainroom.core.run.client import snapshot
from trainroom.tui import fmt
from trainroom.tui.app import ControlRoom
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.result import ActionResult
from trainroom.tui.widgets.header import RunHeader

START_S = 120.0  # torch's import on a loaded 2-core machine, then a few steps
FAULT_STEP = 25
CKPT_EVERY = 10
LAST_CKPT = 20  # the last checkpoint before the fault step


# ------------------------------------------------------------------------------------ helpers


def _dead_with_checkpoint(info: runs.RunInfo) -> dict[str, Any]:
    """DEAD at the fault step, once the last checkpoint before it has verified (so the resume
    plan's checkpoint is the one the test expects)."""

    def ready() -> dict[str, Any] | None:
        s = status(info)
        dead = next((f for f in s["findings"] if f["code"] == "DEAD"), None)
        ckpt = next(
            (c for c in s["checkpoints"] if c["state"] == "verified" and c["step"] == LAST_CKPT), None
        )
        # `latest` is read by the disk probe, a second behind the verification at most.
        if (
            s["state"] == "dead"
            and dead
            and dead["evidence"].get("last_verified_step") == LAST_CKPT
            and ckpt
            and s["latest_checkpoint"]
            and s["latest_checkpoint"] == ckpt["promoted"]
        ):
            return s
        return None

    return wait_for(ready, timeout=START_S, what=f"DEAD at step {FAULT_STEP} with step {LAST_CKPT} verified")


def _start_silent_death(**kw: Any) -> runs.RunInfo:
    return start_demo(
        fault="silent-death", fault_step=FAULT_STEP, ckpt_every=CKPT_EVERY, step_delay=0.02, **kw
    )


def _vram_figures(d: dict[str, Any]) -> list[str]:
    v = d["vram"]
    if v["driver_available"]:
        return [f"VRAM {fmt.nbytes(v['driver_total_bytes'])}"]
    # The panel wraps the reason after its colon.
    head, _, rest = (v["driver_reason"] or "").partition(":")
    return [head + ":", rest.strip()] if rest else [head]


def _run_figures(d: dict[str, Any]) -> list[str]:
    """What the main screen must show of a dead run, taken from `trainroom status`'s dict."""
    vocab = d["vocab_size"]
    return [
        f"attempt {d['attempt']}/{len(d['attempts'])}",
        " DEAD ",
        f"step {d['step']}",  # header
        f"pid {d['pid']}  pgid {d['pgid']}",
        "killed by SIGKILL (9)",  # trainer
        f"median {fmt.loss(d['loss'])}",
        f"ln V {math.log(vocab):.2f} (V={vocab})",  # loss
        f"requested {fmt.lr(d['lr']['requested'])}",
        f"effective {fmt.lr(d['lr']['effective'][0])}",  # LR
        "available ",
        f"of {fmt.nbytes(d['host']['mem_total_bytes'])}",
        "page cache",  # host RAM
        *_vram_figures(d),
        f"step {LAST_CKPT}",
        "verified",
        "← latest",  # disk guard
        "CRIT DEAD [r] resume",  # findings
    ]


async def _until(
    pilot: Any, cond: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] = lambda: ""
) -> Any:
    """Let the app run until `cond()` is truthy (a bound on an event, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{detail()}")


async def _shows(app: Any, pilot: Any, figures: list[str], timeout: float = 30.0, what: str = "") -> str:
    missing: list[str] = []

    def all_there() -> str | None:
        text = screen_text(app)
        missing[:] = [f for f in figures if f not in text]
        return None if missing else text

    return await _until(
        pilot,
        all_there,
        timeout,
        what or f"the screen to show {figures}",
        lambda: f"missing {missing}\n{screen_text(app)}",
    )


async def _status(
    pilot: Any,
    info: runs.RunInfo,
    pred: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = START_S,
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        last.clear()
        last.update(status(info))
        return dict(last) if pred(last) else None

    return await _until(
        pilot,
        check,
        timeout,
        what,
        lambda: (
            f"last status: state {last.get('state')} attempt {last.get('attempt')} step {last.get('step')}"
        ),
    )


# ------------------------------------------------------------------------------------ Pilot


@in_loop
async def test_pilot_silent_death_resume_then_kill_against_a_real_keeper(trhome: Path) -> None:
    """Scenario 1 on the real keeper: the panels show the run's figures, the badge turns DEAD,
    `r` shows the exact checkpoint and starts attempt 2, `k` shows the exact PGID and PIDs and
    kills it with before -> after evidence."""
    info = _start_silent_death()
    app = ControlRoom(info.run_id)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: app.connected and app.state is not None, START_S, "the keeper's snapshot")
        d = _dead_with_checkpoint(info)
        assert d["step"] == FAULT_STEP
        await _shows(app, pilot, _run_figures(d), what="the dead run's figures")

        # r: the confirmation names the exact checkpoint the keeper will load.
        await pilot.press("r")
        confirm = await _until(
            pilot,
            lambda: isinstance(app.screen, ConfirmAction) and app.screen,
            60,
            "the resume confirmation",
            lambda: screen_text(app),
        )
        assert confirm.action_name == "resume"
        assert confirm.plan["checkpoint"] == d["latest_checkpoint"]
        assert confirm.plan["step"] == LAST_CKPT
        await _shows(
            app,
            pilot,
            [
                "Resume the run as a new attempt?",
                f"checkpoint: {d['latest_checkpoint']}",
                f"died_at_step: {FAULT_STEP}",
                f"steps_lost: {FAULT_STEP - LAST_CKPT}",
            ],
        )
        await pilot.press("y")
        result = await _until(
            pilot,
            lambda: isinstance(app.screen, ActionResult) and app.screen,
            START_S,
            "the resume result",
            lambda: screen_text(app),
        )
        assert result.outcome.ok, result.outcome.message
        assert result.outcome.before["attempt"] == 1 and result.outcome.after["attempt"] == 2
        await _shows(app, pilot, ["resume: done", "attempt: 1 -> 2", f"from_step: — -> {LAST_CKPT}"])
        await pilot.press("escape")

        d2 = await _status(
            pilot,
            info,
            lambda s: s["attempt"] == 2 and s["state"] == "running" and (s["step"] or 0) > LAST_CKPT,
            "attempt 2 running",
        )
        await _shows(app, pilot, ["attempt 2/2", " RUNNING ", f"pgid {d2['pgid']}"], timeout=60)

        # k: the confirmation names the exact process group and its members.
        await _until(pilot, lambda: app.check_action("kill", ()), 30, "kill to apply")
        await pilot.press("k")
        confirm = await _until(
            pilot,
            lambda: isinstance(app.screen, ConfirmAction) and app.screen,
            60,
            "the kill confirmation",
            lambda: screen_text(app),
        )
        assert confirm.action_name == "kill"
        assert confirm.plan["pgid"] == d2["pgid"]
        pids = [m["pid"] for m in confirm.plan["members"]]
        assert d2["pid"] in pids
        await _shows(
            app,
            pilot,
            [
                "Kill the trainer's process group?",
                f"pgid: {d2['pgid']}",
                *(f"pid {pid}  pgid {d2['pgid']}" for pid in pids),
            ],
        )
        await pilot.press("y")
        result = await _until(
            pilot,
            lambda: isinstance(app.screen, ActionResult) and app.screen,
            60,
            "the kill result",
            lambda: screen_text(app),
        )
        assert result.outcome.ok, result.outcome.message
        assert result.outcome.before["members"] == len(pids) and result.outcome.after["members"] == 0
        await _shows(
            app,
            pilot,
            [
                "kill: done",
                "before -> after",
                f"members: {len(pids)} -> 0",
                f"pids: {', '.join(map(str, pids))} -> none",
            ],
        )
        await pilot.press("escape")

        d3 = await _status(
            pilot,
            info,
            lambda s: s["state"] == "dead" and s["attempt"] == 2,
            "attempt 2 dead after the kill",
            timeout=30,
        )
        assert d3["attempts"][1]["exit_signal"] is not None
        await _shows(app, pilot, ["attempt 2/2", " DEAD ", f"killed by {d3['exit']['signal_name']}"])


# ------------------------------------------------------------------------------------ snapshots


@in_loop
async def test_main_screen_text_at_80x24_and_160x48_with_a_frozen_clock(trhome: Path) -> None:
    """The main screen of a real dead run, rendered twice with one frozen clock: every panel's
    title and figures at 160x48, what matters at 80x24, and a header that loses whole parts (never
    half a word) when it is narrow."""
    info = _start_silent_death()
    d = _dead_with_checkpoint(info)
    frozen = snapshot(info.sock).status_since + 30
    titles = [
        "trainer",
        "VRAM",
        "cadence",
        "learning rate",
        "loss vs tokens",
        "host RAM",
        "disk guard",
        "findings (",
        "ranks",
        "trainer.log",
    ]
    texts: dict[tuple[int, int], str] = {}
    headers: dict[tuple[int, int], str] = {}
    for size in ((160, 48), (80, 24)):
        app = ControlRoom(info.run_id, clock=lambda: frozen)
        async with app.run_test(size=size) as pilot:
            await _until(
                pilot, lambda a=app: a.connected and a.log_lines, START_S, "the snapshot and the log"
            )
            wide = size == (160, 48)
            # At 24 rows the ranks table and the log tail make room for the rest.
            figures = _run_figures(d) + ["DEAD  for 30 s"] + (titles if wide else titles[:-2])
            texts[size] = await _shows(app, pilot, figures, what=f"the main screen at {size}")
            headers[size] = app.query_one(RunHeader).render().plain
    wide_header = texts[(160, 48)].splitlines()[0].rstrip()
    assert wide_header == headers[(160, 48)].rstrip() and wide_header.endswith("killed by SIGKILL")
    narrow = texts[(80, 24)]
    narrow_header = narrow.splitlines()[0].rstrip()
    words = narrow_header.removesuffix(" …").split()
    assert "…" not in words and words, narrow_header
    # Whole words of the full header, in its order: parts left out, none cut.
    full = iter(wide_header.split())
    assert all(any(w == f for f in full) for w in words), (narrow_header, wide_header)
    assert words[:2] == ["trainroom", info.run_id] and "DEAD" in words and str(d["step"]) in words
    assert len(narrow_header) <= 80


# ------------------------------------------------------------------------------------ tmux


def _trainroom_script() -> str | None:
    near = Path(sys.executable).with_name("trainroom")
    return str(near) if near.exists() else shutil.which("trainroom")


def _then_stay(command: str) -> str:
    """The command, then its exit status printed, then a sleep: the pane stays to be read."""
    return "sh -c " + shlex.quote(command + '; echo "[control room closed: $?]"; exec sleep 600')


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
            _then_stay(command),
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
            _then_stay(command),
        )
        self.target = "room:again"

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.target)

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


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: no real terminal to drive")
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_tmux_demo_dead_resume_quit_reopen_kill(
    trhome: Path, pane_factory: Callable[[tuple[int, int]], Pane], size: tuple[int, int]
) -> None:
    """`trainroom demo --fault silent-death` in a real terminal: DEAD appears, `r` + `y` starts
    attempt 2, `q` leaves the run going (the CLI sees steps still coming), `trainroom watch`
    reopens it, `k` + `y` kills attempt 2 and shows the evidence."""
    script = _trainroom_script()
    if script is None:
        pytest.skip("the trainroom console script is not installed (pip install -e .)")
    pane = pane_factory(size)
    pane.start(
        f"{shlex.quote(script)} demo --fault silent-death --fault-step {FAULT_STEP} "
        f"--ckpt-every {CKPT_EVERY} --step-delay 0.02"
    )
    pane.wait(" DEAD ")
    assert pane.pane_size() == size
    (info,) = runs.list_runs()
    d = _dead_with_checkpoint(info)

    pane.keys("r")
    # (at 24 rows the plan scrolls: its first fields and the buttons are what shows)
    pane.wait("Resume the run as a new attempt?", f"step: {LAST_CKPT}", "yes, resume (y)", timeout=60)
    pane.keys("y")
    pane.wait("resume: done", "attempt: 1 -> 2", "esc / enter: close")
    pane.keys("Escape")
    pane.wait_gone("resume: done")
    text = pane.wait("attempt 2/2", " RUNNING ", timeout=60)
    assert text.splitlines()[0].startswith(" trainroom ")
    assert all(len(line) <= size[0] for line in text.splitlines())

    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
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
    pane.wait("attempt 2/2", " RUNNING ", timeout=60)
    pane.keys("k")
    pane.wait(
        "Kill the trainer's process group?",
        f"pgid: {first['pgid']}",
        f"pid {first['pid']}",
        "yes, kill (y)",
        timeout=60,
    )
    pane.keys("y")
    pane.wait(
        "kill: done",
        "before -> after",
        "members: 1 -> 0",
        f"pids: {first['pid']} -> none",
        "esc / enter: close",
        timeout=60,
    )
    pane.keys("Escape")
    pane.wait_gone("kill: done")
    pane.wait(" DEAD ", "attempt 2/2", timeout=30)
    pane.keys("q")
    pane.wait("[control room closed: 0]", timeout=30)
    after = status_json(info.run_id)
    assert after["keeper"] == "alive" and after["state"] == "dead" and after["attempt"] == 2
    assert after["attempts"][1]["exit_signal"] is not None
