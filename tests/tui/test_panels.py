"""The panels as k9s, lazygit and btop users expect them, through Pilot against the real app with
the fake keeper link: a panel focused from the start and again after a zoom; number keys; the
key strip's priority at 80 columns; a help that lists many keys a screen; zoom on any panel;
labelled gauges; the zoomed VRAM panel's process table; and no stale or contradictory figure (a
hung trainer, a stall's age, the loss headline, the disk guard's count, the VRAM title)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.support.tui_fakes import (
    T0,
    GiB,
    MiB,
    dead_run_records,
    healthy_records,
    in_loop,
    make_app,
    rx,
    screen_text,
    settle,
    until,
)
from trainroom.core.findings import Finding, Target
from trainroom.core.samples import DiskSample, GpuDevice, GpuProcess, GpuSample, HostSample
from trainroom.core.wire import protocol as p
from trainroom.tui.screens.help import HelpScreen
from trainroom.tui.widgets.cadence import CadencePanel
from trainroom.tui.widgets.disk import DiskPanel
from trainroom.tui.widgets.findings import FindingsPanel
from trainroom.tui.widgets.loss import LossPanel
from trainroom.tui.widgets.trainer import TrainerPanel
from trainroom.tui.widgets.vram import VramPanel

SIZES = [(80, 24), (160, 48)]


def strip_entries(app: Any) -> list[str]:
    return [e for e in screen_text(app).splitlines()[-1].strip().split("  ") if e]


def duplicate_running() -> list[Any]:
    recs = healthy_records(steps=10)
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="DUPLICATE_TRAINER",
                severity="critical",
                message="a second trainer (pid 4974) holds 3.2 GiB of the same GPU",
                first_seen=T0 + 6,
                last_seen=T0 + 6,
                action="kill",
                target=Target(pids=[4974], label="pid 4974, the second trainer"),
            )
        )
    )
    return recs


def gpu_probe(t: float, name: str = "NVIDIA GeForce RTX 3060 (fake)") -> p.ProbeSample:
    return p.ProbeSample(
        t=t,
        gpu=GpuSample(
            t=t,
            available=True,
            per_process=True,
            devices=[GpuDevice(index=0, name=name, used_bytes=11 * GiB, total_bytes=12 * GiB)],
            processes=[
                GpuProcess(pid=4242, used_bytes=7 * GiB, ours=True),
                GpuProcess(pid=4243, used_bytes=1 * GiB, ours=True),
                GpuProcess(pid=5100, used_bytes=2 * GiB),
                GpuProcess(pid=5200, used_bytes=512 * MiB, exists=False),
            ],
        ),
        host=HostSample(t=t, available=True, mem_available_bytes=20 * GiB, mem_total_bytes=31 * GiB),
        disk=DiskSample(path="/ckpt", used_fraction=0.5, total_bytes=1000 * GiB, free_bytes=500 * GiB),
    )


# ------------------------------------------------------------------------ focus, numbers, zoom


@in_loop
@pytest.mark.parametrize("size", SIZES)
async def test_a_panel_has_the_focus_from_the_start_and_numbers_jump_to_each(tmp_path, size) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10, ranks=2))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        assert app.focused is app.query_one(FindingsPanel)
        text = screen_text(app)
        # Each border carries its number, btop-style, in Tab's order.
        for mark in ("¹findings", "²trainer", "³VRAM", "⁴cadence", "⁵learning rate", "⁶loss", "⁷host RAM"):
            assert mark in text, mark
        for key, panel in (("3", "vram"), ("4", "cadence"), ("6", "loss"), ("8", "disk"), ("1", "findings")):
            await pilot.press(key)
            await pilot.pause()
            assert app.focused is not None and app.focused.id == panel, key
            assert app.screen.maximized is None  # each has room in its place
        await pilot.press("0")  # the tenth: the log
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "log"
        if size == (80, 24):
            assert app.screen.maximized is app.focused  # the short layout hides it: it comes zoomed


@in_loop
@pytest.mark.parametrize("leave", ["z", "escape"])
async def test_after_a_zoomed_log_the_focus_is_back_on_a_panel_in_sight(tmp_path, leave: str) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("8")  # the disk guard, in its place
        await pilot.press("0")  # the log: hidden at 24 rows, so zoomed
        await pilot.pause()
        assert app.screen.maximized is not None and app.focused is not None and app.focused.id == "log"
        await pilot.press(leave)
        await until(pilot, lambda: app.screen.maximized is None, "the zoom ending")
        await until(pilot, lambda: app.focused is not None and app.focused.id == "disk", "the focus back")
        await pilot.press("tab")  # and Tab goes on from there
        assert app.focused is not None and app.focused.id == "ranks"


@in_loop
async def test_z_enlarges_the_findings_and_the_cadence(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), duplicate_running())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        findings = app.query_one(FindingsPanel)
        small = findings.size.height
        await pilot.press("z")
        await pilot.pause()
        assert app.screen.maximized is findings and findings.size.height > small + 5
        await pilot.press("z", "4", "z")
        await pilot.pause()
        assert app.screen.maximized is app.query_one(CadencePanel)


# ------------------------------------------------------------------------ the key strip, help


@in_loop
@pytest.mark.parametrize("records", [duplicate_running, lambda: healthy_records(steps=10)])
async def test_the_strip_at_80_columns_keeps_the_moving_keys_before_rare_actions(tmp_path, records) -> None:
    app, _, _ = make_app(str(tmp_path), records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        entries = strip_entries(app)
    assert {"tab panels", "/ search", "o runs", "z zoom"} <= set(entries), entries
    assert entries[-2:] == ["? help", "q quit"]
    if "C reclaim" in entries:
        assert entries.index("C reclaim") > entries.index("z zoom")
    fixes = [e for e in entries if e.startswith("^k")]
    if records is duplicate_running:
        # The fix is on the strip first; short of room it is said in a word.
        assert entries[0] == "^k kill" and fixes == ["^k kill"]


@in_loop
async def test_the_strip_at_160_columns_says_the_fix_whole(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), duplicate_running())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        entries = strip_entries(app)
    assert entries[0] == "^k kill pid 4974, the second trainer"
    assert entries[1:5] == ["tab panels", "/ search", "o runs", "z zoom"]


@in_loop
async def test_help_at_80x24_lists_a_key_a_line_in_groups(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=5))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await pilot.pause()
        text = screen_text(app)
    rows = [line for line in text.splitlines() if re.search(r"█ (\^k|[A-Za-z/?]|tab|shift\+tab) +\S", line)]
    assert len(rows) >= 10, text  # a wrapped table held four
    assert "act on the run" in text and "move" in text
    assert re.search(r"R +Resume .* not now: attempt 1", text)
    assert all(len(line) <= 80 for line in text.splitlines())


# ------------------------------------------------------------------------ gauges and VRAM


@in_loop
@pytest.mark.parametrize("size", SIZES)
async def test_every_gauge_says_what_it_measures(tmp_path, size) -> None:
    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    labels = ["this run  █", "allocator █", "disk █"]
    if size == (160, 48):
        # At 24 rows the host and cadence panels have room for their figures only.
        labels += ["host RAM █", "to stall █"]
    for label in labels:
        assert label in text, label


@in_loop
async def test_the_vram_title_keeps_fake_at_80_columns(tmp_path) -> None:
    recs = healthy_records(steps=10)
    recs.append(gpu_probe(T0 + 6))
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    assert "³VRAM 12.0 GiB · RTX 3060 (fake)" in text


@in_loop
async def test_the_zoomed_vram_panel_lists_the_gpu_processes_the_runs_own_marked(tmp_path) -> None:
    recs = healthy_records(steps=10, ranks=2)
    recs.append(gpu_probe(T0 + 6))
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(VramPanel)
        assert "4242" not in panel.render().plain  # type: ignore[union-attr]
        await pilot.press("3", "z")
        await pilot.pause()
        assert app.screen.maximized is panel
        lines = screen_text(app).splitlines()
    table = [line for line in lines if re.match(r"\s+\d{4}\s", line)]
    assert [line.split()[0] for line in table] == ["4242", "4243", "5100", "5200"]
    assert "7.0 GiB" in table[0] and "● this run · rank 0" in table[0]
    assert "● this run · rank 1" in table[1]
    assert "another process" in table[2] and "●" not in table[2]
    assert "gone: memory left behind" in table[3]
    assert any("pid" in line and "memory" in line and "whose" in line for line in lines)


# ------------------------------------------------------------------------ stale or contradictory


def halted_records(state: str = "hung") -> list[Any]:
    recs = healthy_records(steps=10)  # the last step at T0 + 5.5
    recs.append(p.RunStatus(t=T0 + 20, state=state, reason="alive, heartbeats flowing, no step within 10 s"))
    return recs


@in_loop
@pytest.mark.parametrize("state", ["hung", "stalled"])
async def test_a_halted_trainer_is_not_running_and_its_rate_is_the_last_one_seen(
    tmp_path, state: str
) -> None:
    app, _, _ = make_app(str(tmp_path), halted_records(state), now=T0 + 30)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        trainer = app.query_one(TrainerPanel).render().plain  # type: ignore[union-attr]
        assert "running" not in trainer and f"{state}: last step 24 s ago" in trainer
        assert f"{state.upper()}  was 2 steps/s" in text and "0.5 s/step" not in text
        assert "was 2 steps/s  reporter" in text  # where the figure came from, beside it
        header = text.splitlines()[0]
        assert "no step for 24 s (bound 10 s)" in header and "within 10 s" not in header
        # The age moves with the clock: the header and the trainer panel say it live.
        app.clock = lambda: T0 + 75
        app.redraw()
        await pilot.pause()
        text = screen_text(app)
        assert "no step for 1m09s (bound 10 s)" in text.splitlines()[0], text.splitlines()[0]
        assert f"{state}: last step 1m09s ago" in text and "24 s ago" not in text


@in_loop
async def test_the_loss_headline_is_the_curves_own_figure_with_an_outlier_rank(tmp_path) -> None:
    recs = healthy_records(steps=10, ranks=2)
    for i in range(10, 20):
        t = T0 + 1 + i * 0.5
        recs.append(rx(1, 0, t, p.Step(step=i, t=t, tokens=(i + 1) * 8192, loss=2.0, lr=[1e-4])))
        recs.append(rx(1, 1, t, p.Step(step=i, t=t, tokens=(i + 1) * 8192, loss=10.8, lr=[1e-4])))
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        loss = app.query_one(LossPanel)
        head = loss.render().plain.splitlines()[0]  # type: ignore[union-attr]
    # The curve is rank 0's: the headline names it and says where it ends, not the median of
    # the two ranks (6.4, a figure no curve shows).
    assert head.startswith("rank 0 2  ") and "worst r1 10.8" in head and "6.4" not in head
    assert "rank 0" in (loss.border_title or "")


@in_loop
async def test_the_disk_guard_counts_the_checkpoints_on_disk(tmp_path) -> None:
    recs = healthy_records(steps=10)
    for i in range(92):
        recs.append(
            p.CheckpointState(
                path=f"/ckpt/step-{i:06d}", step=i, state="verified", t=T0 + 3 + i * 0.01, size_bytes=GiB
            )
        )
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        disk = app.query_one(DiskPanel)
        await pilot.pause()
        assert disk.border_title == "disk guard · 92 checkpoints"
        sub = disk.border_subtitle or ""
        assert re.fullmatch(r"checkpoints 1–\d+ of 92, newest first", sub), sub
        shown = int(sub.split("–")[1].split()[0])
        assert "step 91" in screen_text(app)
        disk.focus()
        await pilot.press("G")
        await pilot.pause()
        assert disk.border_subtitle == f"checkpoints {92 - shown + 1}–92 of 92, newest first"
        assert "step 0 " in disk.render().plain  # type: ignore[union-attr]


@in_loop
async def test_a_dead_run_says_its_rate_as_the_last_one(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), dead_run_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    # The rate it last had (steps between records over their time), said as the last one.
    assert re.search(r"\bwas \d+(\.\d+)? steps/s", text) and "killed by SIGKILL" in text, text


@in_loop
async def test_a_number_key_over_the_runs_overview_does_not_move_the_room_behind_it(tmp_path) -> None:
    from trainroom.tui.screens.runs import RunsScreen

    app, _, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RunsScreen), "the runs overview")
        await pilot.press("3")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunsScreen), "the overview closing")
        await pilot.pause()
        assert app.focused is app.query_one(FindingsPanel) and app.screen.maximized is None


@in_loop
async def test_the_vram_panel_says_the_run_s_and_the_device_s_figures_as_status_does(tmp_path) -> None:
    # orphan-context: the device holds 11.2 GiB, the run's own process 4 GiB (an orphan the rest).
    import msgspec

    from trainroom.core.run.status import status_dict
    from trainroom.core.run.status_text import status_lines

    recs = healthy_records(steps=10)
    probe = next(r for r in recs if isinstance(r, p.ProbeSample))
    gpu = msgspec.structs.replace(
        probe.gpu, processes=[GpuProcess(pid=4242, used_bytes=4 * GiB, exists=True, ours=True)]
    )
    recs[recs.index(probe)] = msgspec.structs.replace(probe, gpu=gpu)
    app, _, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        (line,) = [x for x in status_lines(status_dict(app.state)) if x.startswith("  vram ")]
    assert re.search(r"this run  \S+\s+4\.0 GiB", text), text
    assert re.search(r"device    \S+\s+11\.2 GiB", text), text
    assert "device 11.2 GiB of 12.0 GiB used, this run 4.0 GiB" in line, line
