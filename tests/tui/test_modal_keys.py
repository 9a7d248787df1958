"""A box open owns the keyboard: with a result or a confirmation open, `q` does what
the box's own hint says (closes the result, says no to the confirmation) and never quits the
room behind it; a stray key of the room (`t` for the theme, `R`, a panel's number) does nothing
behind the box, and nothing is saved."""

from __future__ import annotations

from tests.support.tui_fakes import in_loop, make_app, screen_text, settle, until
from tests.tui.test_actions import live_records
from trainroom.tui import theming
from trainroom.tui.evidence import ActionOutcome
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.result import ActionResult


@in_loop
async def test_a_result_box_owns_the_keys_and_q_closes_it_as_its_hint_says(tmp_path, trhome) -> None:
    app, _, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        theme, saved = app.theme, theming.remembered()
        room = app.screen
        behind = room.focused
        app.push_screen(ActionResult(ActionOutcome(action="verify", ok=True, message="verified step 50")))
        await until(pilot, lambda: isinstance(app.screen, ActionResult), "the result")
        await pilot.pause()
        assert "q / esc / enter: close" in screen_text(app)
        # Tab is the room's priority key (panel to panel): behind a box it moves nothing.
        for key in ("t", "R", "C", "2", "z", "slash", "tab", "shift+tab"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ActionResult), key
            assert room.focused is behind, key
        assert app.theme == theme and theming.remembered() == saved
        await pilot.press("q")
        await until(pilot, lambda: not isinstance(app.screen, ActionResult), "the result closing")
        assert app.is_running  # closed the box, not the room


@in_loop
async def test_a_confirmation_owns_the_keys_and_q_says_no(tmp_path, trhome) -> None:
    app, _, _ = make_app(str(tmp_path), live_records())
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        theme = app.theme
        answers: list[bool | None] = []
        app.push_screen(ConfirmAction("kill", {"pid": 11, "pgid": 11}, "kill pid 11"), answers.append)
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the confirmation")
        await pilot.pause()
        assert "n / esc / q: no" in screen_text(app)
        for key in ("t", "R", "2"):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, ConfirmAction), key
        assert app.theme == theme and answers == []
        await pilot.press("q")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmAction), "the confirmation closing")
        assert answers == [False] and app.is_running
