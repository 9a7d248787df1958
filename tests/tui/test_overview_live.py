"""The runs overview and the startup picker as the issue asked (33 item 4, 35 item 4), through
Pilot: the picker's figures move as the runs do and Esc on it goes back to the newest run training
(said, never a silent quit); at 80 columns the worst finding is in sight; the filter is kept when
the overview is reopened; a HUNG run shows no steps/s; the command is its script and arguments."""

from __future__ import annotations

from typing import Any

from tests.support.tui_fakes import (
    T0,
    FakeLink,
    FakeRuns,
    build_state,
    dead_run_records,
    healthy_records,
    in_loop,
    run_info,
    screen_text,
    shipped_themes,
    until,
    write_log,
)
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p
from trainroom.tui import fmt
from trainroom.tui.app import ControlRoom
from trainroom.tui.overview import row_of, short_command
from trainroom.tui.screens.runs import RunsScreen

ARGV = ["/root/.pyenv/versions/3.11.7/bin/python3", "-u", "-m", "trainroom.core.demo.train", "--steps", "100"]


def _source(
    tmp_path: Any, live: tuple[str, ...] = ("run-alpha", "run-beta")
) -> tuple[FakeRuns, dict[str, FakeLink]]:
    infos = []
    names = (*live, "run-dead")
    for i, name in enumerate(names):
        d = tmp_path / name
        d.mkdir()
        write_log(str(d))
        info = run_info(name, str(d), alive=name != "run-dead", created=T0 + 10 * i)
        info.argv = ARGV
        infos.append(info)
    links = {n: FakeLink(build_state(healthy_records(steps=5 + i), run_id=n)) for i, n in enumerate(live)}
    return FakeRuns(infos, links, {"run-dead": build_state(dead_run_records(), run_id="run-dead")}), links


def _step_cell(app: ControlRoom, run: str) -> str:
    line = next((x for x in screen_text(app).splitlines() if run in x), "")
    return line


def test_a_hung_run_shows_no_rate_and_the_command_is_its_script() -> None:
    recs = healthy_records(steps=20)
    running = build_state(recs)
    info = run_info(running.run_id, "/tmp/nowhere")
    info.argv = ARGV
    row = row_of(info, running, True)
    assert row.steps_per_s is not None and row.rate_from == "reporter"  # the healthy fake reports
    from trainroom.tui.screens.runs import rate_cell

    assert rate_cell(row.steps_per_s, row.rate_from) == fmt.rate(row.steps_per_s, "")
    assert rate_cell(9.94, "read times") == "≈" + fmt.rate(9.94, "")  # an estimate is said so
    assert rate_cell(None, None) == "—"
    # The overview's title says what "≈" means while a row shows one, and not otherwise.
    import dataclasses

    said = RunsScreen([row], T0, None)._title()
    assert "≈" not in said
    guessed = dataclasses.replace(row, rate_from="read times")
    assert RunsScreen([guessed], T0, None)._title().endswith(" · ≈ steps/s: when its log lines were read")
    hung: RunState = build_state([*recs, p.RunStatus(t=T0 + 400, state="hung", reason="no step for 300 s")])
    row = row_of(info, hung, True)
    assert row.state == "hung" and row.steps_per_s is None
    assert row.command == "trainroom.core.demo.train --steps 100"
    assert short_command(["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "/w/train.py"]) == (
        "torchrun --nproc-per-node=2 /w/train.py"
    )
    assert (
        short_command(["/usr/bin/python3", "-X", "dev", "/w/train.py", "--lr", "1e-4"])
        == "train.py --lr 1e-4"
    )


@in_loop
async def test_the_startup_picker_moves_with_the_runs_and_esc_goes_back_to_the_newest(tmp_path) -> None:
    source, links = _source(tmp_path)
    app = ControlRoom(None, source=source, clock=lambda: T0 + 400, theme_dirs=shipped_themes())
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the picker")
        await until(pilot, lambda: " 5 " in _step_cell(app, "run-beta"), "run-beta at step 5")
        links["run-beta"]._snapshot = build_state(healthy_records(steps=40), run_id="run-beta")
        await until(
            pilot, lambda: " 39 " in _step_cell(app, "run-beta"), "run-beta's step moving", tries=1500
        )
        assert "trainroom.core.demo.train --steps 100" in screen_text(app)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "back to the room")
        await until(
            pilot, lambda: app.state is not None and app.run_id == "run-beta", "the newest run training"
        )
        assert app.is_running
        assert any(
            "no run picked: watching the newest run training, run-beta" in n.message
            for n in app._notifications
        )


@in_loop
async def test_at_80_columns_the_worst_finding_shows_and_the_filter_is_kept(tmp_path) -> None:
    source, _ = _source(tmp_path)
    app = ControlRoom("run-alpha", source=source, clock=lambda: T0 + 400, theme_dirs=shipped_themes())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state is not None, "the run")
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen) and len(app.screen.rows) == 3, "rows")
        await pilot.pause()
        dead = _step_cell(app, "run-dead")
        assert "DEAD" in dead and "worst" in screen_text(app), screen_text(app)
        # The state, and beside it the run's first row of findings (the one to fix first, as the
        # findings panel and `status` lead with it: here the low host RAM a resume waits on).
        row = next(r for r in app.screen.rows if r.run_id == "run-dead")
        assert row.worst_code is not None and row.worst_code in dead, dead
        await pilot.press("slash", "b", "e", "t", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen) and [r.run_id for r in screen.shown()] == ["run-beta"]
        await pilot.press("enter")  # open it
        await until(
            pilot, lambda: not isinstance(app.screen, RunsScreen) and app.run_id == "run-beta", "run-beta"
        )
        await pilot.press("o")
        await until(
            pilot, lambda: isinstance(app.screen, RunsScreen) and len(app.screen.rows) == 3, "rows again"
        )
        await pilot.pause()
        assert "1 match 'bet'" in screen_text(app)
        assert [r.run_id for r in app.screen.shown()] == ["run-beta"]  # type: ignore[attr-defined]
