"""The control room says when an uninstrumented trainer's log was read and nothing in it was
recognised (pass --log-pattern), and names the recogniser's unit once steps are read."""

from __future__ import annotations

from tests.support.tui_fakes import T0, in_loop, make_app, screen_text, settle, until
from trainroom.core.wire import protocol as p


@in_loop
async def test_an_unrecognised_log_is_said_in_the_trainer_panel_until_a_step_is_read(tmp_path) -> None:
    started = [
        p.AttemptStarted(n=1, t=T0, pid=4242, pgid=4242, start_time=T0, argv=["python", "loop.py"], cwd="/w"),
        p.RunStatus(t=T0, state="starting"),
        p.LogRecognised(t=T0 + 2, attempt=1, name="none", lines=200),
    ]
    app, link, _ = make_app(str(tmp_path), started, now=T0 + 3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        assert "telemetry no step" in text and "pass --log-pattern" in text
        step = p.Step(step=10, t=T0 + 4, loss=2.5, source="log")
        link.push(
            [
                p.LogRecognised(t=T0 + 4, attempt=1, name="lines", unit="printed steps"),
                p.Received(attempt=1, rank=0, t=T0 + 4, msg=step),
            ]
        )
        await until(pilot, lambda: app.state is not None and app.state.log_recogniser == "lines", "the step")
        app.redraw()
        await pilot.pause()
        text = screen_text(app)
        assert "telemetry log l" in text and "--log-pattern" not in text
