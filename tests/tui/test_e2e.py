"""The control room against a real keeper and a real demo trainer (CPU torch), in-process through
Textual's Pilot (the real console script in a real tmux pane is tests/e2e/test_tmux.py).

Nothing here is a fake: the keeper, the trainer, its SIGKILL, the resume and the kill are real.
Every wait is a generous bound on something the keeper or the screen reports (torch starts slowly
on a loaded 2-core machine); no test asserts how fast anything happened.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.helpers import status
from tests.support.room import (
    FAULT_STEP,
    LAST_CKPT,
    START_S,
    dead_with_checkpoint,
    start_silent_death,
)
from tests.support.tui_fakes import in_loop, screen_text
from trainroom.core.run import store as runs
from trainroom.core.run.client import snapshot
from trainroom.tui import fmt
from trainroom.tui.app import ControlRoom
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.result import ActionResult
from trainroom.tui.widgets.header import RunHeader


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
        "killed by SIGKILL",  # trainer
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
        "CRIT DEAD [R] resume",  # findings
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
    R shows the exact checkpoint and starts attempt 2, ctrl+k shows the exact PGID and PIDs and
    kills it with before -> after evidence."""
    info = start_silent_death()
    app = ControlRoom(info.run_id)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: app.connected and app.state is not None, START_S, "the keeper's snapshot")
        d = dead_with_checkpoint(info)
        assert d["step"] == FAULT_STEP
        await _shows(app, pilot, _run_figures(d), what="the dead run's figures")

        # R: the confirmation names the exact checkpoint the keeper will load.
        await pilot.press("R")
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
                f"from {d['latest_checkpoint']}, saved at step {LAST_CKPT}",
                f"the last attempt reached step {FAULT_STEP}",
            ],
        )
        # One line says what happens and what is lost; no field's name anywhere.
        assert confirm.headline == (
            f"starts attempt 2 from {d['latest_checkpoint']} (step {LAST_CKPT}); the "
            f"{FAULT_STEP - LAST_CKPT} steps after it, up to step {FAULT_STEP}, are trained again"
        )
        starts = ("checkpoint:", "died at step", "steps lost", "argv", "driver bytes", "mem available")
        assert not any(line.startswith(starts) for line in confirm.lines), confirm.lines
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
        text = await _shows(app, pilot, ["resume: done", "before → after"])
        assert re.search(r"attempt\s+1\s+→\s+2", text) and re.search(
            rf"from step\s+—\s+→\s+{LAST_CKPT}", text
        ), text
        await pilot.press("escape")

        d2 = await _status(
            pilot,
            info,
            lambda s: s["attempt"] == 2 and s["state"] == "running" and (s["step"] or 0) > LAST_CKPT,
            "attempt 2 running",
        )
        await _shows(app, pilot, ["attempt 2/2", " RUNNING ", f"pgid {d2['pgid']}"], timeout=60)

        # ctrl+k: the confirmation names the exact process group and its members.
        await _until(pilot, lambda: app.why_not("kill") is None, 30, "kill to apply")
        await pilot.press("ctrl+k")
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
                f"SIGTERM to process group {d2['pgid']} ({len(pids)} process(es)), SIGKILL to any left after",
                *(f"pid {pid}  " for pid in pids),
            ],
        )
        assert confirm.headline.startswith(f"kills process group {d2['pgid']} ({len(pids)} process")
        assert "loses " in confirm.headline and "last verified checkpoint at step" in confirm.headline
        said = "\n".join([confirm.headline, *confirm.lines])
        for internal in ("process group:", "empty:", "label:", "nothing left:", "pgid"):
            assert internal not in said, internal
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
        text = await _shows(app, pilot, ["kill: done", "before → after"])
        assert re.search(rf"processes\s+{len(pids)}\s+→\s+0", text), text
        assert re.search(rf"pids\s+{', '.join(map(str, pids))}\s+→\s+none", text), text
        await pilot.press("escape")

        d3 = await _status(
            pilot,
            info,
            # The user's own kill is a stop, not a death.
            lambda s: s["state"] == "stopped" and s["attempt"] == 2,
            "attempt 2 ended by the kill",
            timeout=30,
        )
        assert d3["attempts"][1]["exit_signal"] is not None
        await _shows(app, pilot, ["attempt 2/2", " STOPPED ", f"killed by {d3['exit']['signal_name']}"])


# ------------------------------------------------------------------------------------ snapshots


@in_loop
async def test_main_screen_text_at_80x24_and_160x48_with_a_frozen_clock(trhome: Path) -> None:
    """The main screen of a real dead run, rendered twice with one frozen clock: every panel's
    title and figures at 160x48, what matters at 80x24, and a header that loses whole parts (never
    half a word) when it is narrow."""
    info = start_silent_death()
    d = dead_with_checkpoint(info)
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
