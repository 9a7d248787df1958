"""The command line (`:`, k9s's) through Pilot: a verb acts exactly as its key does (the same
plan request to the keeper, the same confirmation), arguments where the key has none (`:prune
keep 3`, `:theme light`), completion with tab, the breadcrumb of where it was opened, and a verb
that cannot be carried out said in words, nothing done."""

from __future__ import annotations

from tests.support.tui_fakes import (
    T0,
    GiB,
    dead_run_records,
    healthy_records,
    in_loop,
    make_app,
    screen_text,
    settle,
    until,
)
from trainroom.core.wire import protocol as p
from trainroom.tui.screens.cmdline import CommandLine
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.processes import ProcessesScreen
from trainroom.tui.screens.runs import RunsScreen


async def _command(app, pilot, line: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press("colon")
    await until(pilot, lambda: isinstance(app.screen, CommandLine), "the command line")
    await pilot.press(*line)
    await pilot.press("enter")
    await until(pilot, lambda: not isinstance(app.screen, CommandLine), "the line carried out")


def _said(app) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(n.message) for n in app._notifications]


@in_loop
async def test_a_verb_acts_as_its_key_with_the_same_confirmation(tmp_path) -> None:
    saved = [
        p.CheckpointState(path=f"/ckpt/step-{s:06d}", step=s, state="verified", t=T0 + s / 10, size_bytes=GiB)
        for s in (2, 4, 6, 8)
    ]
    app, link, _ = make_app(str(tmp_path), [*healthy_records(steps=10), *saved])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+k")  # the key, for the record
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the key's confirmation")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmAction), "cancelled")
        await until(pilot, lambda: app.flow.current is None, "the flow released")
        await _command(app, pilot, "kill")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the same confirmation")
        await pilot.press("n")
        await until(pilot, lambda: app.flow.current is None, "the flow released again")
        assert link.requests[0] == link.requests[1] == ("kill", {}, False)

        await _command(app, pilot, "prune keep 3")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the prune's confirmation")
        await pilot.press("n")
        await until(pilot, lambda: app.flow.current is None, "released")
        assert link.requests[2] == ("prune", {"keep": 3}, False)

        await _command(app, pilot, "prune keep three")
        assert any("keep: expected a whole number, got 'three'" in m for m in _said(app))
        await _command(app, pilot, "prune keep")
        assert any(
            "say `prune [keep KEEP] [include-rejected yes|no] [dry-run yes|no]`, or `prune`" in m
            for m in _said(app)
        )
        assert len(link.requests) == 3

        await _command(app, pilot, "theme light")
        assert app.theme == "trainroom-light"
        await _command(app, pilot, "frobnicate")
        assert any(":frobnicate: no such command" in m for m in _said(app))
        await _command(app, pilot, "job")
        assert any("no node of a job" in m for m in _said(app))
        await _command(app, pilot, "runs")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the runs overview")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "back")


@in_loop
async def test_tab_completes_and_the_breadcrumb_says_where(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("colon")
        await until(pilot, lambda: isinstance(app.screen, CommandLine), "the command line")
        await pilot.pause()
        assert "runs › 20250101-120000-train-ab12 › findings" in screen_text(app)
        await pilot.press("p", "r", "o")
        await pilot.pause()
        assert "processes" in screen_text(app)  # the verbs that match, listed
        await pilot.press("tab", "enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessesScreen), "the processes screen")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProcessesScreen), "back")
        await _command(app, pilot, "resume 1200")
        assert any("a resume starts from the last verified checkpoint" in m for m in _said(app)), _said(app)
