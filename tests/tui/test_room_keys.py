"""The keys through Pilot, against the real app with the fake keeper link: the header follows the
worst finding; the findings list focuses, scrolls, opens a finding whole and keeps the resolved
ones; a fix key names its target and acts on it; every key acts or says why; Tab, zoom, the log's
scroll and search, the loss plot's scales; the keymap from trainroom.toml; what quitting says."""

from __future__ import annotations

import argparse
import re
from typing import Any

import pytest

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
from trainroom.core.findings import Finding, Target
from trainroom.core.wire import protocol as p
from trainroom.tui.app import ControlRoom
from trainroom.tui.bindings import KeymapError, keymap_of
from trainroom.tui.entry import run_app
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.finding import FindingDetail
from trainroom.tui.screens.help import HelpScreen
from trainroom.tui.screens.search import SearchPrompt
from trainroom.tui.widgets.findings import FindingsPanel
from trainroom.tui.widgets.header import RunHeader
from trainroom.tui.widgets.logtail import LogTailPanel
from trainroom.tui.widgets.loss import LossPanel
from trainroom.tui.widgets.ranks import RanksPanel
from trainroom.tui.widgets.trainer import TrainerPanel


def raised(code: str, severity: str, message: str, t: float, **kw: Any) -> p.FindingRaised:
    return p.FindingRaised(
        finding=Finding(code=code, severity=severity, message=message, first_seen=t, last_seen=t, **kw)  # type: ignore[arg-type]
    )


def nonfinite_running() -> list[Any]:
    recs = healthy_records(steps=10)
    recs.append(
        raised(
            "NONFINITE",
            "critical",
            "loss is NaN at step 9 (first in module blocks.3.attn)",
            T0 + 6,
            evidence={"step": 9, "module": "blocks.3.attn", "loss_scale": 65536.0},
        )
    )
    return recs


def duplicate_running() -> list[Any]:
    recs = healthy_records(steps=10)
    recs.append(
        raised(
            "DUPLICATE_TRAINER",
            "critical",
            "a second trainer (pid 4974) holds 3.2 GiB of the same GPU",
            T0 + 6,
            action="kill",
            target=Target(pids=[4974], label="pid 4974, the second trainer"),
            evidence={"pid": 4974, "used_bytes": int(3.2 * GiB), "cmdline": ["python", "train.py"]},
        )
    )
    return recs


def many_findings() -> list[Any]:
    recs = healthy_records(steps=10)
    long = "and its evidence goes on well past the edge of an 80-column terminal " * 2
    for i, (code, sev) in enumerate(
        [
            ("DIVERGENCE", "critical"),
            ("LOSS_SPIKE", "warning"),
            ("ORPHAN_CONTEXT", "critical"),
            ("STALE_LOCK", "warning"),
            ("DISK_HIGH", "warning"),
            # (no code here follows from another: a list of roots, to scroll)
            ("SLOW", "info"),
        ]
    ):
        recs.append(
            raised(
                code, sev, f"{code.lower()} number {i} {long}", T0 + i, evidence={"used_bytes": (i + 1) * GiB}
            )
        )
    return recs


def badge_colour(app: ControlRoom) -> str:
    header = app.query_one(RunHeader)
    level = header.view.level  # type: ignore[union-attr]
    style = header.get_component_rich_style(f"header--level-{level}")
    return str(style.bgcolor.name) if style.bgcolor else ""  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------ 1 header


@in_loop
async def test_the_header_follows_the_worst_open_finding_and_is_green_only_when_all_is_well(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        header = app.query_one(RunHeader)
        assert header.view is not None and header.view.level == "ok" and header.view.worst_code is None
        green = badge_colour(app)
        link.push(nonfinite_running()[-1:])
        await until(
            pilot, lambda: header.view is not None and header.view.level == "crit", "the badge turning"
        )
        await pilot.pause()
        first = screen_text(app).splitlines()[0]
        assert " RUNNING  NONFINITE" in first, first
        red = badge_colour(app)
        assert red != green
        assert red.lower() == app.get_css_variables()["trainroom-state-dead"].lower()
        link.push([p.FindingCleared(ident="NONFINITE", t=T0 + 30)])
        await until(
            pilot, lambda: header.view is not None and header.view.level == "ok", "the badge back to green"
        )
        # A run the user stopped is not dead: dim, no alarm.
        link.push(
            [
                p.AttemptEnded(n=1, t=T0 + 40, exit_signal=15),
                p.RunStatus(t=T0 + 40, state="stopped", reason="killed by the user"),
            ]
        )
        await until(pilot, lambda: header.view is not None and header.view.state == "stopped", "stopped")
        assert header.view.level == "dim"
        await pilot.pause()
        assert " STOPPED " in screen_text(app).splitlines()[0]


# ------------------------------------------------------------------------------------ 2 findings


@in_loop
async def test_the_findings_list_scrolls_opens_a_finding_whole_and_keeps_the_resolved(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), many_findings())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(FindingsPanel)
        codes = [r.code for r in panel.view.open]  # type: ignore[union-attr]
        # Most severe first, then newest.
        assert codes == [
            "ORPHAN_CONTEXT",
            "DIVERGENCE",
            "DISK_HIGH",
            "STALE_LOCK",
            "LOSS_SPIKE",
            "SLOW",
        ]
        assert app.focused is panel  # the findings have the focus from the start
        for _ in range(5):
            await pilot.press("j")
        await pilot.pause()
        assert panel.selected == "SLOW"
        text = screen_text(app)
        # The cursor's finding is shown whole, wrapped; the list scrolled to it.
        assert "INFO SLOW" in text and "80-column terminal" in text.split("INFO SLOW")[1]
        shown = panel.render().plain  # type: ignore[union-attr]
        assert "ORPHAN_CONTEXT" not in shown and re.fullmatch(r"\d+–\d+ of \d+", panel.border_subtitle or "")
        await pilot.press("k", "enter")
        await until(pilot, lambda: isinstance(app.screen, FindingDetail), "the finding's detail")
        await pilot.pause()
        detail = screen_text(app)
        assert "WARN LOSS_SPIKE" in detail and "open since" in detail
        assert re.search(r"used\s+2\.0 GiB", detail)  # evidence in human units, in words
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, FindingDetail), "the detail closing")
        link.push([p.FindingCleared(ident="DIVERGENCE", t=T0 + 60)])
        await until(pilot, lambda: len(panel.view.resolved) == 1, "the history")  # type: ignore[union-attr]
        await pilot.press("G")
        await pilot.pause()
        text = screen_text(app)
        assert "resolved (1)" in text and "DIVERGENCE" in text


@in_loop
async def test_a_fix_key_names_its_target_and_acts_on_it(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), duplicate_running())
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        assert "CRIT DUPLICATE_TRAINER [^k] kill pid 4974, the second trainer" in text
        assert text.splitlines()[-1].startswith(" ^k kill pid 4974, the second trainer")
        await pilot.press("ctrl+k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the confirmation")
        await pilot.pause()
        assert "Kill pid 4974, the second trainer?" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: len(link.requests) == 2, "the confirmed request")
        await pilot.press("escape")
        # With the trainer panel focused, the same key is for the trainer's own group.
        app.query_one(TrainerPanel).focus()
        await pilot.pause()
        app.redraw()
        await pilot.pause()
        assert "[^k]" not in screen_text(app).split("DUPLICATE_TRAINER")[1].splitlines()[0]
        await pilot.press("ctrl+k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the trainer's confirmation")
        await pilot.press("n")
    plan = link.requests[0]
    assert link.requests[0][:2] == ("kill", {"finding": "DUPLICATE_TRAINER"}) and plan[2] is False
    assert link.requests[1][1]["finding"] == "DUPLICATE_TRAINER" and "expect" in link.requests[1][1]
    assert link.requests[2] == ("kill", {}, False)


@in_loop
async def test_a_finding_offers_only_a_key_that_can_act(tmp_path) -> None:
    recs = dead_run_records()
    recs.append(raised("HUNG", "critical", "no heartbeat for 300 s", T0 + 300, action="dump"))
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        row = next(r for r in app.findings_now.open if r.code == "HUNG")  # type: ignore[union-attr]
        assert row.key is None and row.why_not and "not running" in row.why_not
        assert "CRIT HUNG  no heartbeat" in text and "[d]" not in text


# ------------------------------------------------------------------------------------ 3, 4 keys


@in_loop
@pytest.mark.parametrize("key,action", [("ctrl+k", "kill"), ("d", "dump"), ("U", "continue")])
async def test_a_key_that_cannot_act_says_why(tmp_path, key: str, action: str) -> None:
    app, link, _ = make_app(str(tmp_path), dead_run_records())
    said: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        app.notify = lambda message, **kw: said.append(str(message))  # type: ignore[method-assign]
        await pilot.press(key)
        await pilot.pause()
    assert said == [f"{action}: not now, the trainer is not running (attempt 1 ended: killed by SIGKILL)"]
    assert link.requests == []


@in_loop
async def test_tab_moves_between_panels_and_zooms_the_ones_80x24_has_no_room_for(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10, ranks=2))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.focused is app.query_one(FindingsPanel)  # a panel has the focus from the start
        order = [app.focused.id]  # type: ignore[union-attr]
        for _ in range(9):
            await pilot.press("tab")
            order.append(app.focused.id)  # type: ignore[union-attr]
        assert order == [
            "findings",
            "trainer",
            "vram",
            "cadence",
            "lr",
            "loss",
            "host",
            "disk",
            "ranks",
            "log",
        ]
        # The log is hidden at 24 rows: it came zoomed, with the header and the keys kept.
        assert app.screen.maximized is app.query_one(LogTailPanel)
        text = screen_text(app)
        assert "last line of the log" in text and text.splitlines()[0].startswith(" trainroom ")
        await pilot.press("shift+tab")
        assert app.focused is app.query_one(RanksPanel) and app.screen.maximized is app.focused
        await pilot.press("shift+tab")  # the disk guard has room: shown in its place
        assert app.focused.id == "disk" and app.screen.maximized is None  # type: ignore[union-attr]
        await pilot.press("z")
        assert app.screen.maximized is app.focused
        await pilot.press("z")
        assert app.screen.maximized is None


@in_loop
async def test_the_log_scrolls_follows_and_searches(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        log = app.query_one(LogTailPanel)
        log.focus()
        await pilot.pause()
        assert log.following
        await pilot.press("k", "k", "k")
        await pilot.pause()
        assert not log.following and "(scrolled: G follows)" in (log.border_title or "")
        await pilot.press("G")
        assert log.following
        await pilot.press("slash")
        await until(pilot, lambda: isinstance(app.screen, SearchPrompt), "the search prompt")
        await pilot.press(*"ITER 2", "enter")
        await until(pilot, lambda: log.match_line is not None, "the match")
        assert log.view is not None and log.view[log.match_line] == "iter 29: loss 2.2100, time 12.34ms"  # type: ignore[index]
        await pilot.press("n")
        assert log.view[log.match_line] == "iter 28: loss 2.2200, time 12.34ms"  # type: ignore[index]
        await pilot.press("N", "N")
        assert log.view[log.match_line] == "iter 29: loss 2.2100, time 12.34ms"  # type: ignore[index]
        said: list[str] = []
        app.notify = lambda message, **kw: said.append(str(message))  # type: ignore[method-assign]
        await pilot.press("N")
        assert said == ["no newer line holds 'ITER 2'"]
        await pilot.pause()
        assert "/ITER 2" in (log.border_title or "")


@in_loop
async def test_the_loss_plot_takes_a_log_scale_and_the_recent_window(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=40))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        loss = app.query_one(LossPanel)
        whole = loss.render().plain  # type: ignore[union-attr]
        await pilot.press("l")
        assert loss.log_y and loss.border_title == "loss vs tokens · log"
        await pilot.press("l", "f")
        assert not loss.log_y and loss.recent and loss.border_title == "loss vs tokens · recent fifth"
        await pilot.pause()
        fitted = loss.render().plain  # type: ignore[union-attr]
        # The x axis now starts late in the run: its first label is no longer the first token count.
        assert whole.splitlines()[-1].split()[0] == "8.19k" and fitted.splitlines()[-1].split()[0] != "8.19k"


@in_loop
async def test_the_help_scrolls_at_80x24(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=5))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await pilot.pause()
        assert "Command palette" not in screen_text(app)
        await pilot.press("G")
        await pilot.pause()
        text = screen_text(app)
        assert "Command palette" in text and "Select text" in text
        assert all(len(line) <= 80 for line in text.splitlines())


@in_loop
@pytest.mark.parametrize("width", [40, 60])
async def test_the_key_strip_holds_whole_entries_at_narrow_widths(tmp_path, width: int) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(width, 20)) as pilot:
        await settle(app, pilot)
        last = screen_text(app).splitlines()[-1]
    entries = [e for e in last.strip().split("  ") if e]
    assert entries[-2:] == ["? help", "q quit"], last
    assert all(re.fullmatch(r"\S+ [a-z /]+", e) for e in entries), entries
    # The host is short of the RAM a resume's load needs (HOST_RAM_LOW): its reclaim comes first.
    assert entries[0] == "C reclaim"
    if width >= 60:
        assert entries[1] == "R resume"


# ------------------------------------------------------------------------------------ keymap


def test_the_keymap_from_trainroom_toml(tmp_path) -> None:
    from trainroom.core.configuration.config import decode_config

    keys = decode_config('[keys]\nkill = "K"\nsearch = "?"\n').keys
    with pytest.raises(KeymapError) as e:
        keymap_of(keys, "/p/trainroom.toml")
    assert str(e.value) == "/p/trainroom.toml: keys: search and help are both on '?': give one another key"
    keys = decode_config('[keys]\nkill = "K"\nsearch = "/"\nhelp = "h,f1"\n').keys
    assert keymap_of(keys) == {"trainroom.kill": "K", "trainroom.search": "slash", "trainroom.help": "h,f1"}


@in_loop
async def test_a_remapped_kill_key_is_the_one_shown_and_the_one_that_acts(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), duplicate_running(), keymap={"trainroom.kill": "K"})
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert "[K] kill pid 4974, the second trainer" in screen_text(app)
        await pilot.press("ctrl+k")
        await pilot.pause()
        assert link.requests == []
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the confirmation")
    assert link.requests[0][0] == "kill"


def test_a_bad_keys_table_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRAINROOM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trainroom.toml").write_text('[keys]\nkill = "q"\n')
    assert run_app(argparse.Namespace(run=None, theme=None)) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"trainroom: {tmp_path / 'trainroom.toml'}: keys: kill and quit are both on 'q': give one another key\n"
    )
    (tmp_path / "trainroom.toml").write_text('[keys]\nkil = "x"\n')
    assert run_app(argparse.Namespace(run=None, theme=None)) == 2
    assert "keys.kil: unknown key" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ 9, 10


@in_loop
async def test_an_instrumented_trainer_not_heard_yet_is_not_called_uninstrumented(tmp_path) -> None:
    started = [
        p.AttemptStarted(
            n=1, t=T0, pid=4242, pgid=4242, start_time=T0, argv=["python", "train.py"], cwd="/w"
        ),
        p.RunStatus(t=T0, state="starting"),
    ]
    app, link, _ = make_app(str(tmp_path), started, now=T0 + 3)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        assert "telemetry not heard yet" in screen_text(app)
        link.push([p.Received(attempt=1, rank=0, t=T0 + 4, msg=p.Hello(pid=4242))])
        await until(pilot, lambda: app.state is not None and app.state.attempt.instrumented, "the Hello")  # type: ignore[union-attr]
        app.redraw()
        await pilot.pause()
        assert "telemetry reporter" in screen_text(app)


def test_quitting_says_the_run_goes_on_and_how_to_come_back(tmp_path) -> None:
    import asyncio

    async def farewell(records: list[Any]) -> str | None:
        app, _, _ = make_app(str(tmp_path), records)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running, "the quit")
        return app.farewell()

    live = asyncio.run(farewell(healthy_records(steps=5)))
    rid = "20250101-120000-train-ab12"
    assert live == (
        f"trainroom: run {rid} goes on (attempt 1, running, pid 4242)\n"
        f"  reattach: trainroom watch {rid}\n"
        f"  stop it:  trainroom kill {rid}"
    )
    dead = asyncio.run(farewell(dead_run_records()))
    assert dead is not None and dead.startswith(f"trainroom: run {rid} is dead (its keeper is still up)")
    assert f"  resume it:  trainroom resume {rid}" in dead.splitlines()


@in_loop
async def test_routine_telemetry_waits_for_the_routine_frame_and_a_verdict_does_not(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), healthy_records(steps=5), routine_interval_s=3600.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        # The focus given at start is drawn (what a key acts on follows it) before the count starts.
        await until(
            pilot, lambda: app._aim == (app.focused, app.panels().findings.selected), "the focus drawn"
        )
        await pilot.pause()
        drawn = app.renders
        link.push([p.Received(attempt=1, rank=0, t=T0 + 30, msg=p.Step(step=99, t=T0 + 30, loss=2.0))])
        await until(
            pilot, lambda: app.state is not None and app.state.current_step() == 99, "the step folded"
        )
        for _ in range(5):
            await pilot.pause(0.05)
        assert app.renders == drawn  # folded, not drawn: no frame per step
        link.push([raised("LOSS_SPIKE", "warning", "loss 9.1 at step 99", T0 + 31)])
        await until(pilot, lambda: app.renders > drawn, "the finding drawn at once")
        assert "LOSS_SPIKE" in screen_text(app)


# ------------------------------------------------------------------------------------ 8 runs


@in_loop
async def test_the_runs_overview_sorts_opens_another_run_and_goes_back(tmp_path) -> None:
    from tests.support.tui_fakes import FakeLink, FakeRuns, build_state, run_info, shipped_themes, write_log
    from trainroom.tui.screens.runs import RunsScreen

    dirs = {name: tmp_path / name for name in ("live", "dead", "other")}
    for d in dirs.values():
        d.mkdir()
        write_log(str(d))
    live = run_info("run-live", str(dirs["live"]), created=T0 + 100)
    dead = run_info("run-dead", str(dirs["dead"]), alive=False, created=T0)
    other = run_info("run-other", str(dirs["other"]), created=T0 + 50)
    links = {
        "run-live": FakeLink(build_state(healthy_records(steps=10), run_id="run-live")),
        "run-other": FakeLink(build_state(nonfinite_running(), run_id="run-other")),
    }
    journal = {"run-dead": build_state(dead_run_records(), run_id="run-dead")}
    runs = FakeRuns([dead, other, live], links, journal)
    app = ControlRoom("run-live", source=runs, clock=lambda: T0 + 400, theme_dirs=shipped_themes())
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("o")
        await until(
            pilot, lambda: isinstance(app.screen, RunsScreen) and bool(app.screen.rows), "the overview"
        )
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await pilot.pause()
        text = screen_text(app)
        lines = {
            r: next(line for line in text.splitlines() if r in line)
            for r in ("run-live", "run-dead", "run-other")
        }
        assert (
            "▶ run-live" in lines["run-live"]
            and "RUNNING" in lines["run-live"]
            and " 9 " in lines["run-live"]
        )
        assert (
            "DEAD · keeper gone" in lines["run-dead"]
            and "322" in lines["run-dead"]
            # The host short of RAM stands in the way of its resume: named first (`STANDS_IN_THE_WAY`).
            and "HOST_RAM_LOW +1" in lines["run-dead"]
        )
        assert "NONFINITE" in lines["run-other"]
        # Newest first by default; by state, the worst first.
        order = sorted(("run-live", "run-other", "run-dead"), key=text.index)
        assert order == ["run-live", "run-other", "run-dead"], order
        await pilot.press("s")  # by state
        await pilot.pause()
        assert screen.sort_by == "state"
        text = screen_text(app)
        assert text.index("run-dead") < text.index("run-live")
        # The live current run is taken as the app has it; the other live one was peeked at once,
        # the finished one read from its journal.
        assert runs.peeks.count("run-other") >= 1 and "run-live" not in runs.peeks
        # Enter on run-other: the control room follows it, without leaving the app.
        table = screen.query_one("#runs-table")
        table.move_cursor(row=table.get_row_index("run-other"))  # type: ignore[attr-defined]
        await pilot.press("enter")
        await until(pilot, lambda: app.run_id == "run-other" and app.state is not None, "the other run")
        app.redraw()
        await pilot.pause()
        assert "run-other" in screen_text(app).splitlines()[0] and "NONFINITE" in screen_text(app)
        # o then Esc: back to it, nothing changed.
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the overview again")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "back")
        assert app.run_id == "run-other"
