"""The control room's main screen at 80x24 and 160x48: the panels show the figures of a RunState
built from keeper records; live deltas arrive through the reader thread; a keeper that goes away
leaves a banner with the journal's last state."""

from __future__ import annotations

import re

import msgspec

from tests.support.tui_fakes import (
    T0,
    FakeLink,
    FakeRuns,
    build_state,
    dead_run_records,
    healthy_records,
    in_loop,
    make_app,
    run_info,
    rx,
    screen_text,
    settle,
    shipped_themes,
    until,
)
from trainroom.core.findings import Finding
from trainroom.core.run.summary import RunSummary, WorstFinding
from trainroom.core.samples import GpuSample, HostSample
from trainroom.core.wire import protocol as p
from trainroom.tui.app import ControlRoom
from trainroom.tui.link import OverviewReader
from trainroom.tui.messages import RunChanged
from trainroom.tui.overview import row_of
from trainroom.tui.screens.runs import RunsScreen


def sick_run_records() -> list:
    """Eight ranks, rank 5 at 40.0; an LR 200x too small; no driver view."""
    recs = healthy_records(steps=6, ranks=8, effective_lr=5e-7)
    recs.append(rx(1, 5, T0 + 10, p.Step(step=6, t=T0 + 10, tokens=7 * 8192, loss=40.0, lr=[5e-7])))
    recs.append(
        p.ProbeSample(
            t=T0 + 11,
            gpu=GpuSample(
                t=T0 + 11, available=False, reason="driver view unavailable: NVML Shared Library Not Found"
            ),
            host=HostSample(
                t=T0 + 11,
                available=True,
                mem_available_bytes=20 << 30,
                mem_total_bytes=31 << 30,
                page_cache_bytes=1 << 30,
            ),
        )
    )
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="RANK_OUTLIER",
                severity="critical",
                key="5",
                first_seen=T0 + 10,
                message="rank 5 loss 40.0 vs median 2.6 across 8 ranks",
                evidence={"rank": 5},
            )
        )
    )
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="LR_MISMATCH",
                severity="critical",
                first_seen=T0 + 9,
                message="requested 1.00e-04, effective 5.00e-07 (0.005x)",
            )
        )
    )
    return recs


@in_loop
async def test_main_screen_160x48_shows_every_panel(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    for figure in (
        "20250101-120000-train-ab12",
        "attempt 1/1",
        " DEAD ",
        "step 322",  # header
        "pid 4242",
        "pgid 4242",
        "killed by SIGKILL",
        "ran 3m32s",  # trainer
        "11.0 GiB",
        "6.0 GiB",
        "ratio — driver/alloc",  # the attempt ended: its allocator figures belong to no live trainer
        "VRAM 12.0 GiB · RTX 3060",
        "util 97%",  # VRAM
        "last step 0.7 s before the end",  # cadence
        "requested 1.00e-04",
        "effective 1.00e-04",  # LR
        "loss vs tokens",
        "ln V 10.82 (V=50257)",
        "c checkpoint",  # loss
        "CRIT DEAD [R] resume  trainer killed by SIGKILL at step 322; 22 steps lost since step 300",
        "WARN HOST_RAM_LOW [C] reclaim",  # findings
        "available 2.1 GiB of 31.0 GiB",
        "page cache 6.0 GiB",  # host
        "used 94%",
        "free 60.0 GiB",
        "verified",
        "← latest",
        "rejected",
        "truncated",  # disk
        "rank",
        "reserved",
        "median 2.31",  # ranks
        "trainer.log",
        "last line of the log",  # log tail
    ):
        assert figure in text, figure
    # the dead run's key strip offers the findings' fixes first, not kill: the reclaim the host's
    # low RAM needs before the resume that loads a checkpoint into it
    footer = text.splitlines()[-1]
    assert (
        footer.startswith(" C reclaim  R resume")
        and "kill" not in footer
        and footer.rstrip().endswith("? help  q quit")
    )


@in_loop
async def test_main_screen_80x24_keeps_what_matters(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    lines = text.splitlines()
    assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
    for figure in (
        " DEAD ",
        "step 322",
        "pid 4242  pgid 4242",
        "killed by SIGKILL",
        "ratio —",  # the attempt ended: no allocator figure
        "CRIT DEAD [R] resume",
        "HOST_RAM_LOW [C] reclaim",
        "used 94%",
        "ln V 10.82",
        "available 2.1 GiB",
    ):
        assert figure in text, figure
    assert "trainer.log" not in text and "reserved" not in text  # log tail and ranks collapse
    assert "R resume" in lines[-1] and "? help" in lines[-1] and "q quit" in lines[-1]


@in_loop
async def test_ranks_lr_and_no_driver(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), sick_run_records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    assert "driver view unavailable:" in text and "NVML Shared Library Not Found" in text
    assert "effective 5.00e-07 (0.005x)" in text
    assert "requested 1.00e-04, effective 5.00e-07 (0.005x)" in text
    assert "worst r5 40" in text
    assert "RUNNING" in text and "8 ranks" in text
    # the outlier leads the ranks table: its row (rank 5, step 6, loss 40) comes before rank 0's
    lines = text.splitlines()
    row5 = next(i for i, line in enumerate(lines) if re.search(r"│\s+5\s+6\s+40\s+500 ms", line))
    row0 = next(i for i, line in enumerate(lines) if re.search(r"│\s+0\s+5\s+11\.23\s+500 ms", line))
    assert row5 < row0


@in_loop
async def test_live_deltas_reach_the_screen(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), healthy_records(steps=5))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        assert "step 4" in screen_text(app)
        link.push(
            [
                rx(1, 0, T0 + 20 + i, p.Step(step=i, t=T0 + 20 + i, tokens=i * 8192, loss=2.0))
                for i in range(5, 400)
            ]
        )
        link.push(
            [p.RunStatus(t=T0 + 430, state="stalled", reason="alive, heartbeats flowing, no step for 14 s")]
        )
        await until(pilot, lambda: app.state is not None and app.state.status == "stalled", "the stall")
        app.redraw()
        await pilot.pause()
        text = screen_text(app)
    assert "step 399" in text and " STALLED " in text and "no step for 14 s" in text
    assert app.state is not None and app.state.steps_total == 400


@in_loop
async def test_a_burst_of_changes_is_rendered_once(tmp_path) -> None:
    handled: list[RunChanged] = []
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=3))

    def hook(message: object) -> None:
        if isinstance(message, RunChanged):
            handled.append(message)

    async with app.run_test(size=(80, 24), message_hook=hook) as pilot:
        await settle(app, pilot)
        for _ in range(50):
            app.post_message(RunChanged())
        await pilot.pause()
        await pilot.pause()
    assert len(handled) == 1


@in_loop
async def test_keeper_gone_banner_shows_the_journal_and_the_resume_key(tmp_path) -> None:
    journal = build_state(dead_run_records())
    app, link, runs = make_app(
        str(tmp_path), healthy_records(steps=5), journal=journal, reconnect_interval_s=30
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert app.connected and app.why_not("kill") is None
        runs.runs = [msgspec.structs.replace(r, alive=False) for r in runs.runs]  # its process is gone
        link.go_away("keeper gone: connection reset by peer")
        await until(
            pilot,
            lambda: not app.connected and app.state is not None and app.state.status == "dead",
            "the journal's state after the keeper left",
        )
        app.redraw()
        await pilot.pause()
        text = screen_text(app)
        assert app.why_not("resume") is None
        assert (
            app.why_not("kill")
            == "the keeper is gone: resume works without it, or use `trainroom kill RUN` in a shell"
        )
        banner = app.query_one("#banner")
        assert banner.display and banner.view.reason == "keeper gone: connection reset by peer"
    assert "keeper gone since" in text
    assert "journal's last state: DEAD" in text and "last step 322" in text
    assert "press R to resume" in text and "KEEPER GONE" in text
    assert link.closed


@in_loop
async def test_the_keeper_coming_back_is_watched_again(tmp_path) -> None:
    app, link, runs = make_app(str(tmp_path), healthy_records(steps=5), reconnect_interval_s=0.02)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        runs.links[app.run_id] = FakeLink(build_state(healthy_records(steps=9)))
        link.go_away()
        await until(pilot, lambda: not app.connected, "the disconnect")
        await until(pilot, lambda: app.connected, "the reconnect")
        await until(
            pilot, lambda: app.state is not None and app.state.current_step() == 8, "the new snapshot"
        )
        app.redraw()
        await pilot.pause()
        assert not app.query_one("#banner").display
    assert runs.connects == [app.run_id, app.run_id]


@in_loop
async def test_a_run_without_a_keeper_opens_on_its_journal(tmp_path) -> None:
    app, _, runs = make_app(str(tmp_path), dead_run_records(), alive=False, reconnect_interval_s=30)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    assert "keeper gone since" in text and "the keeper is not running" in text
    assert "journal's last state: DEAD" in text and runs.connects == []


@in_loop
async def test_several_live_runs_open_the_runs_overview_to_pick_from(tmp_path) -> None:
    older, newer = tmp_path / "a", tmp_path / "b"
    older.mkdir()
    newer.mkdir()
    infos = [
        run_info("run-older", str(older), created=T0),
        run_info("run-newer", str(newer), created=T0 + 60),
    ]
    links = {i.run_id: FakeLink(build_state(healthy_records(steps=2), run_id=i.run_id)) for i in infos}
    app = ControlRoom(
        None, source=FakeRuns(infos, links), clock=lambda: T0 + 100, theme_dirs=shipped_themes()
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the runs overview")
        await pilot.pause()
        text = screen_text(app)
        assert "2 runs training (of 2): pick one" in text and "run-newer" in text and "run-older" in text
        await pilot.press("enter")  # the newest is highlighted first
        await until(pilot, lambda: app.state is not None, "the picked run's snapshot")
    assert app.run_id == "run-newer"


@in_loop
async def test_the_one_run_training_opens_directly_past_lingering_keepers(tmp_path) -> None:
    # Three keepers live; two of them stay after their trainer ended (their fresh summaries say
    # so): "live" is a trainer that runs, so the control room opens the one training run, no picker.
    from trainroom.core.run import summary as summaries
    from trainroom.core.run.store import JOURNAL_NAME

    infos = []
    for i, name in enumerate(("ended-a", "training", "ended-b")):
        d = tmp_path / name
        d.mkdir()
        infos.append(run_info(name, str(d), created=T0 + i))
        if name != "training":
            (d / JOURNAL_NAME).write_bytes(b"x")
            mark = summaries.journal_mark(d / JOURNAL_NAME)
            summaries.write(
                d,
                RunSummary(run_id=name, created=T0 + i, status="exited", attempt=1, journal=mark),
            )
    links = {i.run_id: FakeLink(build_state(healthy_records(steps=2), run_id=i.run_id)) for i in infos}
    app = ControlRoom(
        None, source=FakeRuns(infos, links), clock=lambda: T0 + 100, theme_dirs=shipped_themes()
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state is not None, "the training run's snapshot")
        assert not isinstance(app.screen, RunsScreen)
    assert app.run_id == "training"


def test_an_overview_row_is_live_only_while_its_trainer_runs(tmp_path) -> None:
    info = run_info("r", str(tmp_path), created=T0)
    assert row_of(info, build_state(healthy_records(steps=3)), True).training
    ended = row_of(info, build_state(dead_run_records()), True)  # its keeper stays after the death
    assert ended.keeper and not ended.training
    assert not row_of(info, build_state(healthy_records(steps=3)), False).training


def test_the_runs_overview_reads_a_finished_runs_summary_not_its_journal(tmp_path) -> None:
    infos = [
        run_info("run-a", str(tmp_path), alive=False, created=T0),
        run_info("run-b", str(tmp_path), alive=False, created=T0 + 1),
    ]
    summaries = {
        "run-a": RunSummary(
            run_id="run-a",
            created=T0,
            status="stalled",
            attempt=1,
            attempt_ended=True,
            step=4812,
            findings=1,
            worst=WorstFinding(code="STALLED", severity="critical", message="no step for 40 s"),
        )
    }
    # No journal for either (FakeRuns.load_view would raise): run-a's row comes from its summary,
    # run-b (no summary) is read from its journal, which fails and says so in its row.
    rows = {r.run_id: r for r in OverviewReader(FakeRuns(infos, summaries=summaries)).rows()}
    a, b = rows["run-a"], rows["run-b"]
    assert (a.state, a.step, a.worst_code, a.findings, a.error) == ("stalled", 4812, "STALLED", 1, None)
    assert b.error is not None and b.step is None


def test_the_nodes_of_one_job_are_one_row_in_the_overview(tmp_path) -> None:
    from trainroom.core.configuration.settings import JobOptions, LaunchOptions

    infos = [
        run_info(n, str(tmp_path), alive=False, created=T0 + i) for i, n in enumerate(("n0", "n1", "solo"))
    ]
    journal = {
        "n0": build_state(healthy_records(), run_id="n0"),
        "n1": build_state(dead_run_records(), run_id="n1"),
        "solo": build_state(healthy_records(), run_id="solo"),
    }
    for rank, run in enumerate(("n0", "n1")):
        journal[run].options = LaunchOptions(
            job=JobOptions(name="gpt-xl", source="--job", host=f"h{rank}", node_rank=rank)
        )
    rows = OverviewReader(FakeRuns(infos, journal=journal)).rows()
    assert sorted(r.name for r in rows) == ["job gpt-xl (2 nodes)", "solo"]
    (job,) = [r for r in rows if r.nodes == 2]
    # The worst node speaks for the job (Enter opens it); steps are the slowest node's.
    assert (
        job.run_id == "n1" and job.state == "dead" and job.worst_code == "HOST_RAM_LOW"
    )  # in the way of DEAD's resume
    singles = {i.run_id: row_of(i, journal[i.run_id], False) for i in infos}
    assert None not in (singles["n0"].step, singles["n1"].step)
    assert job.step == min(singles["n0"].step, singles["n1"].step)
    assert job.command == "nodes: n0, n1"


@in_loop
async def test_no_live_run_opens_the_newest_one(tmp_path) -> None:
    infos = [
        run_info("run-a", str(tmp_path), alive=False, created=T0),
        run_info("run-b", str(tmp_path), alive=False, created=T0 + 5),
    ]
    journal = {i.run_id: build_state(dead_run_records(), run_id=i.run_id) for i in infos}
    app = ControlRoom(
        None,
        source=FakeRuns(infos, journal=journal),
        clock=lambda: T0 + 300,
        theme_dirs=shipped_themes(),
        reconnect_interval_s=30,
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.state is not None, "the journal")
    assert app.run_id == "run-b" and not app.connected


@in_loop
async def test_with_no_run_yet_it_waits_for_the_first_one(tmp_path) -> None:
    runs = FakeRuns([])
    app = ControlRoom(
        None, source=runs, clock=lambda: T0 + 100, theme_dirs=shipped_themes(), reconnect_interval_s=0.02
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "looking for a run" in screen_text(app)
        st = build_state(healthy_records(steps=2), run_id="run-late")
        runs.links["run-late"] = FakeLink(st)
        runs.runs.append(run_info("run-late", str(tmp_path)))
        await until(pilot, lambda: app.state is not None, "the first run")
    assert app.run_id == "run-late" and app.connected


@in_loop
async def test_a_run_that_cannot_be_found_is_said_and_nothing_breaks(tmp_path) -> None:
    app = ControlRoom("nope", source=FakeRuns([]), clock=lambda: T0, theme_dirs=shipped_themes())
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await until(pilot, lambda: len(app._notifications) > 0, "the notice")
        (notice,) = list(app._notifications)
        assert notice.title == "cannot watch that run" and "unknown run 'nope'" in notice.message
        assert app.is_running and app.state is None


@in_loop
async def test_an_unreadable_journal_is_said_and_the_keeper_still_looked_for(tmp_path) -> None:
    info = run_info("run-gone", str(tmp_path), alive=False)
    runs = FakeRuns([info])  # no journal for it: load_state raises
    app = ControlRoom(
        "run-gone", source=runs, clock=lambda: T0, theme_dirs=shipped_themes(), reconnect_interval_s=0.02
    )
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await until(pilot, lambda: len(app._notifications) > 0, "the notice")
        assert next(iter(app._notifications)).message.startswith("journal unreadable")
        st = build_state(healthy_records(steps=2), run_id="run-gone")
        runs.links["run-gone"] = FakeLink(st)
        runs.runs[0] = run_info("run-gone", str(tmp_path))  # its keeper is back
        await until(pilot, lambda: app.connected, "the keeper found again")


@in_loop
async def test_a_keeper_that_lives_but_does_not_answer_is_busy_not_gone(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), healthy_records(steps=5), reconnect_interval_s=30)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        link.go_away("keeper at /x/keeper.sock sent no snapshot within 5.0 s")
        await until(pilot, lambda: not app.connected and app.keeper_busy, "the keeper seen busy")
        app.redraw()
        await pilot.pause()
        text = screen_text(app)
    assert "KEEPER BUSY" in text.splitlines()[0] and "keeper not answering since" in text
