"""Every key of the control room, through Pilot: the plan, the confirmation that shows the exact
target, the request with confirm=True, progress, the result with before -> after evidence. The
fake link at the keeper boundary records what the keeper was asked."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from typing import Any

import pytest

from tests.support.tui_fakes import (
    T0,
    GiB,
    dead_run_records,
    default_replier,
    healthy_records,
    in_loop,
    make_app,
    screen_text,
    settle,
    until,
)
from trainroom.core.wire import protocol as p
from trainroom.tui.app import ControlRoom
from trainroom.tui.bindings import COMMANDS
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.help import HelpScreen
from trainroom.tui.screens.result import ActionResult


def live_records() -> list[Any]:
    recs = healthy_records(steps=10)
    recs.append(
        p.CheckpointState(path="/ckpt/step-000100", step=100, state="verified", t=T0 + 3, size_bytes=4 * GiB)
    )
    return recs


async def confirm_screen(app: ControlRoom, pilot: Any, key: str) -> str:
    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, ConfirmAction), f"the confirmation for {key}")
    await pilot.pause()
    return screen_text(app)


async def result_screen(app: ControlRoom, pilot: Any) -> str:
    await until(pilot, lambda: isinstance(app.screen, ActionResult), "the result")
    await pilot.pause()
    return screen_text(app)


@in_loop
async def test_kill_shows_the_pgid_and_its_pids_then_the_evidence(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        text = await confirm_screen(app, pilot, "ctrl+k")
        # The question, one line with what happens and what is lost, then the details in words.
        head = (
            "kills process group 4242 (2 processes, SIGTERM, then SIGKILL after 10 s); "
            "loses 30 steps (at step 130, last verified checkpoint at step 100)"
        )
        assert isinstance(app.screen, ConfirmAction) and app.screen.headline == head
        order = [
            text.index(x)
            for x in ("Kill the trainer's process group?", head[:40], "SIGTERM to", "pid 4242  python")
        ]
        assert order == sorted(order), order
        for said in (
            "SIGTERM to process group 4242 (2 process(es)), SIGKILL to any left after 10 s",
            "then waits up to 50 s for the GPU memory to be released",
            "pid 4242  python train.py",
            "pid 4250  python -c worker",
        ):
            assert said in text, said
        # No field's name: what a person reads is words.
        said_all = "\n".join([app.screen.question, app.screen.headline, *app.screen.lines])
        assert not any("loses" in line for line in app.screen.lines)  # said once, in the headline
        for internal in ("process group:", "empty:", "label:", "nothing left", "pgid", "members", "_"):
            assert internal not in said_all, internal
        await pilot.press("y")
        text = await result_screen(app, pilot)
        assert "kill: done" in text and re.search(r"VRAM used\s+12\.0 GiB\s+→\s+400 MiB", text), text
        assert re.search(r"processes\s+2\s+→\s+0", text)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ActionResult), "the result closing")
    plan = default_replier("kill", {}, False)[0].plan
    assert link.requests == [("kill", {}, False), ("kill", {"expect": plan}, True)]


@in_loop
async def test_cancelling_a_confirmation_asks_nothing_more(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await confirm_screen(app, pilot, "ctrl+k")
        assert app.why_not("kill") == "kill is under way: one action at a time"
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmAction), "the confirmation closing")
        await app.workers.wait_for_complete()
        assert app.why_not("kill") is None
    assert link.requests == [("kill", {}, False)]


@in_loop
@pytest.mark.parametrize(
    "key,action,shown",
    [
        (
            "C",
            "reclaim",
            [
                "Reclaim the host page cache?",
                "reclaims the page cache of cgroup /user.slice (6.0 GiB cached on the machine): its "
                "files are read from disk again; no data is lost",
                "writes 6442450944 (6.0 GiB to reclaim) to /sys/fs/cgroup/user.slice/memory.reclaim",
            ],
        ),
        (
            "P",
            "prune",
            [
                "Delete these checkpoints?",
                "deletes 1 checkpoint (step 100) under /ckpt for good, 4.0 GiB freed; keeps 1",
                "keeps 1: step 200 (one of the last 1 verified)",
                "step 100  4.0 GiB  /ckpt/step-000100",
            ],
        ),
    ],
)
async def test_reclaim_and_prune_confirm_their_target(
    tmp_path, key: str, action: str, shown: list[str]
) -> None:
    app, link, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        text = await confirm_screen(app, pilot, key)
        assert isinstance(app.screen, ConfirmAction) and app.screen.headline == shown[1]
        for line in (shown[0], shown[1][:60], *shown[2:]):
            assert line in text, line
        said_all = "\n".join([app.screen.question, app.screen.headline, *app.screen.lines])
        assert not any(line.startswith("deletes") for line in app.screen.lines)  # the headline's
        for internal in ("bytes", "_", "page cache:", "delete (", "root:", "method:"):
            assert internal not in said_all, internal
        await pilot.press("y")
        text = await result_screen(app, pilot)
        assert f"{action}: done" in text
    assert [(a, c) for a, _, c in link.requests] == [(action, False), (action, True)]


@in_loop
async def test_resume_after_a_death(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        # Keys that cannot act say why, and ask the keeper nothing.
        said: list[str] = []
        app.notify = lambda message, **kw: said.append(str(message))  # type: ignore[method-assign]
        await pilot.press("ctrl+k", "d")
        await pilot.pause()
        assert said == [
            "kill: not now, the trainer is not running (attempt 1 ended: killed by SIGKILL)",
            "dump: not now, the trainer is not running (attempt 1 ended: killed by SIGKILL)",
        ]
        text = await confirm_screen(app, pilot, "R")
        assert "Resume the run as a new attempt?" in text
        assert isinstance(app.screen, ConfirmAction) and app.screen.headline == (
            "starts attempt 2 from /ckpt/step-000300 (step 300); the 22 steps after it, up to step 322, "
            "are trained again"
        )
        assert "from /ckpt/step-000300, saved at step 300 (3.9 GiB)" in text
        assert "runs python train.py --resume /ckpt/step-000300 (resume template from trainroom.toml)" in text
        said_all = "\n".join([app.screen.headline, *app.screen.lines])
        assert not any(x in said_all for x in ("checkpoint:", "steps lost", "died at step", "_", "argv"))
        await pilot.press("y")
        await result_screen(app, pilot)
    assert [(a, c) for a, _, c in link.requests] == [("resume", False), ("resume", True)]


@in_loop
@pytest.mark.parametrize("key,action", [("d", "dump"), ("v", "verify"), ("b", "bench")])
async def test_non_destructive_actions_run_without_a_confirmation(tmp_path, key: str, action: str) -> None:
    app, link, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press(key)
        text = await result_screen(app, pilot)
        assert f"{action}: done" in text
    assert [(a, c) for a, _, c in link.requests] == [(action, False), (action, True)]


@in_loop
async def test_progress_is_shown_while_the_action_runs(tmp_path) -> None:
    release = threading.Event()

    def slow(action: str, args: dict, confirm: bool):
        if not confirm:
            yield p.Reply(id=1, action=action, stage="plan", plan={"device": "cpu"})
            return
        yield p.Reply(id=2, action=action, stage="progress", message="warming up the matmuls")
        release.wait(30)
        yield p.Reply(
            id=2,
            action=action,
            stage="done",
            ok=True,
            message="12.1 TFLOPS: the hardware is fine",
            before={},
            after={"tflops": 12.1},
        )

    app, _, _ = make_app(str(tmp_path), live_records(), replier=slow)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("b")
        strip = app.query_one("#action-strip")
        try:
            await until(pilot, lambda: "warming up the matmuls" in (strip.view or ""), "the progress line")
            # What runs, for how long, its latest line, and the key that cancels it.
            assert re.fullmatch(
                r"bench running \d+ s · X: cancel it · warming up the matmuls", strip.view or ""
            ), strip.view
            app.redraw()
            await pilot.pause()
            lines = screen_text(app).splitlines()
            assert "bench running" in lines[-2] and "X: cancel it" in lines[-2]
            assert lines[-1].startswith(" X cancel bench "), lines[-1]  # the key strip's first key
        finally:
            release.set()
        text = await result_screen(app, pilot)
        # A read-only result says what it found, not a before -> after of nothing.
        assert "12.1 TFLOPS: the hardware is fine" in text and "tflops: 12.1" in text
        assert "before → after" not in text
        assert not strip.display


@in_loop
async def test_an_action_not_available_yet_is_said_plainly(tmp_path) -> None:
    def not_yet(action: str, args: dict, confirm: bool):
        return [
            p.Reply(
                id=1,
                action=action,
                stage="done",
                ok=False,
                message=f"{action} is not available yet (the recovery issue has not landed)",
            )
        ]

    app, link, _ = make_app(str(tmp_path), dead_run_records(), replier=not_yet)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("R")
        text = await result_screen(app, pilot)
    assert "resume: not done" in text
    assert "resume is not available yet (the recovery issue has not landed)" in text
    assert link.requests == [("resume", {}, False)]  # no confirmation for a refusal


@in_loop
async def test_a_keeper_that_cannot_be_reached_is_reported(tmp_path) -> None:
    def broken(action: str, args: dict, confirm: bool):
        raise ConnectionRefusedError(f"[Errno 111] Connection refused: {tmp_path}/keeper.sock")

    app, _, _ = make_app(str(tmp_path), live_records(), replier=broken)
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("v")
        text = await result_screen(app, pilot)
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, ActionResult), "the result closing")
        assert app.check_action("verify", ()) is True  # the failure released the action
    assert "verify: not done" in text and "the keeper could not be reached" in text
    assert "Connection refused" in text


@in_loop
async def test_theme_help_quit_and_the_palette(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert app.theme == "trainroom-dark"
        await pilot.press("t")
        assert app.theme == "trainroom-light"
        await pilot.press("t", "t")
        assert app.theme == "trainroom-dark"

        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help screen")
        await pilot.pause()
        text = screen_text(app)
        await pilot.press("G")  # the rest, scrolled to
        await pilot.pause()
        text += screen_text(app)
        for c in COMMANDS:
            assert c.tooltip[:20] in text, c.tooltip
        assert "not now: attempt 1 is still running: kill it" in text  # resume
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "the help screen closing")

        commands = list(app.get_system_commands(app.screen))
        titles = [c.title for c in commands]
        assert len(titles) == len(set(titles)), titles  # each command once
        assert sum("theme" in t.lower() for t in titles) == 1, titles  # Textual's picker only
        by_title = {c.title: c for c in commands}
        for title in (
            "Kill (^k)",
            "Reclaim (C)",
            "Prune (P)",
            "Resume (R)",
            "Dump (d)",
            "Verify (v)",
            "Bench (b)",
            "Help (?)",
            "Runs (o)",
            "Zoom (z)",
        ):
            assert title in by_title, title
        assert "not now: attempt 1 is still running" in by_title["Resume (R)"].help
        await by_title["Kill (^k)"].callback()
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the palette's kill")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmAction), "the confirmation closing")
        await app.workers.wait_for_complete()

        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the quit")
    assert link.requests == [("kill", {}, False)]


def test_every_binding_has_an_id_and_a_tooltip_and_nothing_destructive_is_a_movement_key() -> None:
    from trainroom.tui.bindings import DESTRUCTIVE, bindings

    keys = {b.key: b for b in bindings()}
    assert sorted(keys) == sorted(
        [
            "ctrl+k",
            "C",
            "P",
            "R",
            "d",
            "U",
            "v",
            "b",
            "X",
            "o",
            "p",
            "H",
            "O",
            "colon",
            "tab",
            "shift+tab",
            "z",
            "slash",
            "l",
            "f",
            "t",
            "question_mark",
            "q",
            *"1234567890",  # the number keys to the panels
        ]
    )
    for b in bindings():
        assert b.id and b.id.startswith("trainroom.") and b.tooltip
    # What a vim, k9s or lazygit user presses to move or search never changes the world.
    movement = {
        "h",
        "j",
        "k",
        "l",
        "g",
        "G",
        "w",
        "b",
        "e",
        "n",
        "N",
        "d",
        "x",
        "p",
        "c",
        "r",
        "u",
        "y",
        "slash",
        "space",
        "enter",
    }
    for b in bindings():
        if b.action in DESTRUCTIVE:
            assert b.key not in movement and (b.key.isupper() or b.key.startswith("ctrl+")), b


def test_the_action_keys_come_from_the_one_table_in_core() -> None:
    from trainroom.core.actions.registry import KEYS as ACTION_KEYS
    from trainroom.core.actions.registry import SPECS as ACTIONS
    from trainroom.core.keeper import actions as keeper_actions
    from trainroom.tui.bindings import DESTRUCTIVE, KEEPER_ACTIONS, bindings

    by_action = {b.action: b for b in bindings()}
    for a in ACTIONS:
        b = by_action[a.name]
        assert (b.key, b.description, b.tooltip, b.id) == (
            a.key,
            a.name,
            a.description,
            f"trainroom.{a.name}",
        )
    assert {a.name: a.key for a in ACTIONS} == ACTION_KEYS
    assert {a.name for a in ACTIONS if a.destructive} == DESTRUCTIVE
    # The keeper serves exactly the actions of the table.
    assert set(keeper_actions.KNOWN) == set(KEEPER_ACTIONS)


@in_loop
async def test_quitting_never_waits_for_an_action_in_flight(tmp_path) -> None:
    release = threading.Event()

    def endless(action: str, args: dict, confirm: bool):
        if not confirm:
            yield p.Reply(id=1, action=action, stage="plan", plan={"device": "cpu"})
            return
        yield p.Reply(id=2, action=action, stage="progress", message="still benching")
        release.wait(60)  # the keeper is still at it when the user leaves

    app, _, _ = make_app(str(tmp_path), live_records(), replier=endless)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("b")
            strip = app.query_one("#action-strip")
            await until(pilot, lambda: "still benching" in (strip.view or ""), "the action under way")
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running, "the quit")
        # What would keep the process from exiting is a non-daemon thread (the worker pool's)
        # still inside the request; only the daemon pump may be left there.
        for _ in range(500):
            stuck = [t for t in _threads_inside("endless") if not t.daemon]
            if not stuck:
                break
            await asyncio.sleep(0.01)
        assert stuck == []
        assert [t.name for t in _threads_inside("endless")] == ["trainroom-bench"]
    finally:
        release.set()


def _threads_inside(function: str) -> list[threading.Thread]:
    frames = sys._current_frames()
    out = []
    for t in threading.enumerate():
        frame = frames.get(t.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == function:
                out.append(t)
                break
            frame = frame.f_back
    return out
