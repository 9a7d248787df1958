"""The runs overview as a k9s user drives it, through Pilot: j/k/g/G move the cursor, `/`
filters and Esc drops the filter, the sorted column's header carries the order, and opening it
raises no error (its rows may come before its table has columns)."""

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
    settle,
    shipped_themes,
    until,
    write_log,
)
from trainroom.tui.app import ControlRoom
from trainroom.tui.screens.runs import RunsScreen


def _room(tmp_path: Any) -> tuple[ControlRoom, list[str]]:
    names = ("run-alpha", "run-beta", "run-gamma", "run-dead")
    infos = []
    for i, name in enumerate(names):
        d = tmp_path / name
        d.mkdir()
        write_log(str(d))
        infos.append(run_info(name, str(d), alive=name != "run-dead", created=T0 + 10 * i))
    links = {
        n: FakeLink(build_state(healthy_records(steps=5 + i), run_id=n)) for i, n in enumerate(names[:3])
    }
    journal = {"run-dead": build_state(dead_run_records(), run_id="run-dead")}
    app = ControlRoom(
        "run-alpha",
        source=FakeRuns(infos, links, journal),
        clock=lambda: T0 + 400,
        theme_dirs=shipped_themes(),
    )
    errors: list[str] = []
    plain = app.notify

    def notify(message: Any, **kw: Any) -> None:
        if kw.get("severity") == "error":
            errors.append(str(message))
        plain(message, **kw)

    app.notify = notify  # type: ignore[method-assign]
    return app, errors


def _cursor(screen: RunsScreen) -> str:
    table = screen.query_one("#runs-table")
    return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)  # type: ignore[attr-defined]


def _order(screen: RunsScreen) -> list[str]:
    return [r.run_id for r in screen.shown()]


@in_loop
async def test_the_overview_moves_filters_and_shows_its_sort_without_an_error(tmp_path) -> None:
    app, errors = _room(tmp_path)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(app, pilot)
        for _ in range(3):  # each opening: rows may come before the columns
            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.rows), "rows")
            await pilot.pause()
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "back")
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen) and len(app.screen.rows) == 4, "rows")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await pilot.pause()
        # Newest first; the header of the sorted column says so, no other carries an arrow.
        assert _order(screen) == ["run-dead", "run-gamma", "run-beta", "run-alpha"]
        header = next(line for line in screen_text(app).splitlines() if " state " in line)
        assert "age ▼" in header and header.count("▼") + header.count("▲") == 1, header
        assert _cursor(screen) == "run-alpha"  # the run watched
        await pilot.press("g")
        assert _cursor(screen) == "run-dead"
        await pilot.press("j", "j")
        assert _cursor(screen) == "run-beta"
        await pilot.press("k")
        assert _cursor(screen) == "run-gamma"
        await pilot.press("G")
        assert _cursor(screen) == "run-alpha"
        await pilot.press("k")
        assert _cursor(screen) == "run-beta"
        # S reverses: the arrow turns.
        await pilot.press("S")
        await pilot.pause()
        header = next(line for line in screen_text(app).splitlines() if " state " in line)
        assert "age ▲" in header and "▼" not in header, header
        assert _order(screen) == ["run-alpha", "run-beta", "run-gamma", "run-dead"]
        assert _cursor(screen) == "run-beta"  # the cursor stays on its run
        # `/` filters; letters typed there are the filter's, not keys (o, q, j, s).
        await pilot.press("slash", "g", "a")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen) and app.is_running
        assert screen.filter == "ga" and _order(screen) == ["run-gamma"]
        assert "1 match 'ga'" in screen_text(app)
        await pilot.press("enter")  # kept; the table has the keys again
        await pilot.pause()
        assert _order(screen) == ["run-gamma"] and _cursor(screen) == "run-gamma"
        await pilot.press("escape")  # the filter goes first
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen) and screen.filter == ""
        assert len(_order(screen)) == 4
        await pilot.press("slash", "d", "e", "a", "d")
        await pilot.pause()
        assert _order(screen) == ["run-dead"]  # its state matches too
        await pilot.press("escape")  # in the box: drops it
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen) and len(_order(screen)) == 4
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "back")
    assert errors == []
