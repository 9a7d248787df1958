"""The result screen in words, through Pilot with the keeper link faked at its boundary: a
dump's stacks take the box's width, one block per rank, scrollable, never squeezed into a
before -> after table; a refusal is said once; a kill whose processes are gone while the
driver holds their memory is done in part, not "not done"."""

from __future__ import annotations

import re
from typing import Any

from tests.support.tui_fakes import in_loop, make_app, screen_text, settle, until
from tests.tui.test_actions import live_records
from trainroom.core.actions.render import confirmation
from trainroom.core.wire import protocol as p
from trainroom.tui.screens.result import ActionResult

STACK = "\n".join(
    ["Thread 0x00007f01 (most recent call first):"]
    + [f'  File "/very/long/path/to/the/trainer/module_{i}.py", line {i} in function_{i}' for i in range(40)]
)


def dump_of_two_ranks(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
    if not confirm:
        plan = {
            "pid": 11,
            "method": "SIGUSR1 (faulthandler)",
            "ranks": [{"rank": 0, "pid": 11}, {"rank": 1, "pid": 12}],
        }
        return [p.Reply(id=1, action=action, stage="plan", plan=plan)]
    after = {
        "method": "faulthandler",
        "ranks": [
            {"rank": 0, "pid": 11, "method": "faulthandler", "message": "", "stacks": STACK},
            {
                "rank": 1,
                "pid": 12,
                "method": "faulthandler",
                "message": "",
                "stacks": STACK.replace("module", "rank1"),
            },
        ],
    }
    return [
        p.Reply(
            id=2,
            action=action,
            stage="done",
            ok=True,
            message="stacks of 2 of 2 ranks, read by faulthandler",
            after=after,
            plan={
                "pid": 11,
                "method": "SIGUSR1 (faulthandler)",
                "ranks": [{"rank": 0, "pid": 11}, {"rank": 1, "pid": 12}],
            },
        )
    ]


async def _result(app: Any, pilot: Any) -> ActionResult:
    await until(pilot, lambda: isinstance(app.screen, ActionResult), "the result")
    await pilot.pause()
    assert isinstance(app.screen, ActionResult)
    return app.screen


@in_loop
async def test_a_dump_shows_each_ranks_stacks_full_width_and_scrolls(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), live_records(), replier=dump_of_two_ranks)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("d")
        screen = await _result(app, pilot)
        text = screen_text(app)
        assert screen.title_text == "dump: done" and "dump: done" in text
        assert [h for h, _ in screen.blocks] == [
            "rank 0 (pid 11), read by faulthandler",
            "rank 1 (pid 12), read by faulthandler",
        ]
        assert "rank 0 (pid 11), read by faulthandler" in text and "before → after" not in text
        assert confirmation("dump", screen.outcome.details, "")[1] == [
            "rank 0: pid 11",
            "rank 1: pid 12",
            "by SIGUSR1 (faulthandler)",
        ]
        # A frame line whole on one screen line: the stacks have the box's width, not a column's.
        assert 'File "/very/long/path/to/the/trainer/module_0.py", line 0 in function_0' in text
        box = screen.query_one("#result-box")
        assert box.size.width >= 150, box.size
        scroll = screen.query_one("#result-evidence")
        assert scroll.max_scroll_y > 0  # 80 frames do not fit: they scroll
        await pilot.press("j", "j", "j")
        await pilot.pause()
        assert scroll.scroll_y == 3
        await pilot.press(
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
            "pagedown",
        )
        await pilot.pause()
        assert "function_39" in screen_text(app) and "rank1_39" in screen_text(app)
        assert "acted on" in screen_text(app) and "rank 1: pid 12" in screen_text(app)
    assert [(a, c) for a, _, c in link.requests] == [("dump", False), ("dump", True)]


@in_loop
async def test_a_refusal_is_said_once_and_a_half_done_kill_is_done_in_part(tmp_path) -> None:
    def refused(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
        return [
            p.Reply(
                id=1, action=action, stage="done", ok=False, message="dump refused: rank 3 has no reporter"
            )
        ]

    app, _, _ = make_app(str(tmp_path), live_records(), replier=refused)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("d")
        screen = await _result(app, pilot)
        text = screen_text(app)
        assert screen.title_text == "dump: refused"
        assert text.count("refused") == 2  # the title and the keeper's words, not "refused: ... refused:"

    def half(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
        if not confirm:
            return [
                p.Reply(
                    id=1,
                    action=action,
                    stage="plan",
                    plan={"pgid": 4242, "members": [{"pid": 4242, "cmdline": ["python"]}], "grace_s": 10.0},
                )
            ]
        return [
            p.Reply(
                id=2,
                action=action,
                stage="done",
                ok=False,
                message="SIGTERM -> pgid 4242: gone; but the driver still holds 1.0 GiB for the run after 50 s",
                before={"members": 1, "vram_bytes": 1 << 30},
                after={"members": 0, "vram_bytes": 1 << 30},
            )
        ]

    app, _, _ = make_app(str(tmp_path), live_records(), replier=half)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+k")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ConfirmAction", "the confirmation")
        await pilot.press("y")
        screen = await _result(app, pilot)
        assert screen.title_text == "kill: done in part"
        assert "before → after" in screen_text(app)


def test_the_running_line_puts_the_countdown_and_the_cancel_key_before_the_keepers_words() -> None:
    from trainroom.tui.action_flow import Running

    r = Running("kill")
    r.progress("waiting for the driver to release VRAM: 1.0 GiB held (per-process); 38 s left")
    text = r.text("X")
    m = re.fullmatch(
        r"kill running \d+ s, (\d+) s left · X: cancel the wait · "
        r"waiting for the driver to release VRAM: 1\.0 GiB held \(per-process\)",
        text,
    )
    assert m is not None and int(m.group(1)) in (37, 38), text
    r.progress("SIGTERM sent to pgid 4242 (2 live)")  # no countdown in this line: none shown
    assert r.text("X").endswith(" · X: cancel the wait · SIGTERM sent to pgid 4242 (2 live)")
    assert "left" not in r.text("X")
    r.cancelling = True
    assert " · cancelling… · " in r.text("X") and "X:" not in r.text("X")
    # What cannot be cancelled names no key.
    assert "cancel" not in Running("prune").text("X")


@in_loop
async def test_a_plan_that_waits_says_what_it_waits_for(tmp_path) -> None:
    import threading

    from tests.support.tui_fakes import dead_run_records

    release = threading.Event()

    def waits(action: str, args: dict[str, Any], confirm: bool) -> Any:
        yield p.Reply(
            id=1, action=action, stage="progress", message="waiting for /ckpt/step-000300's verdict"
        )
        release.wait(30)
        yield p.Reply(id=1, action=action, stage="done", ok=False, message="resume refused: still verifying")

    app, _, _ = make_app(str(tmp_path), dead_run_records(), replier=waits)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("R")
        strip = app.query_one("#action-strip")
        try:
            await until(pilot, lambda: "verdict" in (strip.view or ""), "the plan's progress")
            assert strip.view == "resume: planning · waiting for /ckpt/step-000300's verdict"
        finally:
            release.set()
        screen = await _result(app, pilot)
        assert screen.title_text == "resume: refused"


@in_loop
async def test_at_24_rows_a_long_plan_scrolls_and_the_buttons_stay_in_view(tmp_path) -> None:
    from tests.support.tui_fakes import dead_run_records
    from trainroom.tui.screens.confirm import ConfirmAction

    long_note = "no resume template: the command is unchanged and the checkpoint is only named in " * 3

    def resume_plan(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
        plan = {
            "attempt": 2,
            "checkpoint": "/a/long/path/runs/20261204-163302-train-f5d1/checkpoints/step-000020/step-000020.pt",
            "step": 20,
            "died_at_step": 25,
            "steps_lost": 5,
            "argv": ["/usr/bin/python3.11", "-m", "trainroom.core.demo.train", "--fault", "silent-death"],
            "lost": ["RNG absent: a different data order and dropout from here on"] * 3,
            "note": long_note,
        }
        return [p.Reply(id=1, action=action, stage="plan", plan=plan)]

    app, _, _ = make_app(str(tmp_path), dead_run_records(), replier=resume_plan)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the confirmation")
        await pilot.pause()
        text = screen_text(app)
        assert "Resume the run as a new attempt?" in text
        assert "yes, resume (y)" in text and "cancel (n)" in text, text
