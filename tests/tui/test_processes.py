"""The processes screen (`p`) through Pilot: the run's processes as a tree with their figures,
"—" and the reason once where the driver gives no GPU figure, live as the probe moves, sortable,
and a signal chosen for the row under the cursor goes through the keeper's plan and the same
confirmation as every kill (the request names that pid, its start tick and the signal)."""

from __future__ import annotations

from typing import Any

from tests.support.tui_fakes import (
    T0,
    GiB,
    MiB,
    healthy_records,
    in_loop,
    make_app,
    screen_text,
    settle,
    until,
)
from trainroom.core.samples import GpuProcess, GpuSample, ProcRow, ProcsSample
from trainroom.core.wire import protocol as p
from trainroom.tui.proctable import procs_view
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.processes import ProcessesScreen, SignalPicker

CMD = ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "--lr", "1e-4"]


def table(cpu1: float = 97.5, gpu: GpuSample | None = None) -> p.ProbeSample:
    rows = [
        ProcRow(pid=4242, ppid=1, start_ticks=100, role="agent", state="S", elapsed_s=125.0, cmdline=CMD,
                cpu_percent=0.3, rss_bytes=80 * MiB),
        ProcRow(pid=4243, ppid=4242, start_ticks=110, role="rank", rank=0, state="R", elapsed_s=120.0,
                cmdline=["python", "train.py", "--lr", "1e-4"], cpu_percent=88.0, rss_bytes=2 * GiB),
        ProcRow(pid=4244, ppid=4242, start_ticks=111, role="rank", rank=1, state="R", elapsed_s=120.0,
                cmdline=["python", "train.py", "--lr", "1e-4"], cpu_percent=cpu1, rss_bytes=3 * GiB),
        ProcRow(pid=4250, ppid=4244, start_ticks=150, role="child", rank=1, state="S", elapsed_s=60.0,
                cmdline=["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"],
                cpu_percent=12.0, rss_bytes=500 * MiB),
    ]  # fmt: skip
    return p.ProbeSample(t=T0 + 30, gpu=gpu, procs=ProcsSample(attempt=1, pgid=4242, table=rows))


def records(**kw: Any) -> list[Any]:
    return [*healthy_records(steps=10), table(**kw)]


def test_the_view_is_a_tree_and_sorting_keeps_children_under_their_parent() -> None:
    from tests.support.tui_fakes import build_state

    st = build_state(records())
    view = procs_view(st)
    assert [line.pid for line in view.lines] == [4242, 4243, 4244, 4250]
    assert [line.depth for line in view.lines] == [0, 1, 1, 2]
    assert view.lines[3].cells[1] == "(1)" and view.lines[3].cells[-1].startswith("  └─ python -c")
    assert view.note is not None and "no driver reading" in view.note  # the GPU columns: why "—"
    assert view.lines[1].cells[4] == "—"
    by_cpu = procs_view(st, "cpu")
    assert [line.pid for line in by_cpu.lines] == [4242, 4244, 4250, 4243]  # rank 1 first, its child under it
    gone = GpuSample(t=T0, available=False, reason="driver view unavailable: NVML Shared Library Not Found")
    st2 = build_state([*healthy_records(steps=10), table(gpu=gone)])
    assert "NVML Shared Library Not Found" in (procs_view(st2).note or "")
    known = GpuSample(
        t=T0, available=True, per_process=True,
        processes=[GpuProcess(pid=4244, used_bytes=5 * GiB, ours=True, util_percent=71)],
    )  # fmt: skip
    st3 = build_state([*healthy_records(steps=10), table(gpu=known)])
    assert st3.probe is not None
    from trainroom.core.probes.ptable import with_gpu

    assert st3.probe.procs is not None
    rows = with_gpu(st3.probe.procs.table, known)
    assert [(r.pid, r.gpu_bytes, r.gpu_util_percent) for r in rows if r.gpu_bytes] == [(4244, 5 * GiB, 71)]


@in_loop
async def test_p_lists_the_tree_live_and_a_chosen_signal_is_planned_and_confirmed(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProcessesScreen), "the processes screen")
        await pilot.pause()
        text = screen_text(app)
        assert "runs › 20250101-120000-train-ab12 › processes of attempt 1: 4, 2 rank(s)" in text
        for pid in ("4242", "4243", "4244", "4250"):
            assert pid in text
        assert "97.5" in text and "3.0 GiB" in text and "torch.distributed.run" in text
        assert "gpu columns: no driver reading yet" in text
        # Live: the next probe's figure replaces the old one.
        link.push([table(cpu1=42.0)])
        await until(pilot, lambda: "42.0" in screen_text(app), "the next probe's CPU %")
        # The cursor on rank 1, then its signal.
        await pilot.press("j", "j")
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, SignalPicker), "the signal picker")
        assert "Signal pid 4244 (rank 1):" in screen_text(app)
        await pilot.press("down", "down", "down", "down", "enter")  # TERM INT KILL USR1 STOP
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the confirmation")
        await pilot.pause()
        assert "Send SIGSTOP to pid 4244 (rank 1)?" in screen_text(app)
        await pilot.press("y")
        await until(pilot, lambda: len(link.requests) == 2, "the confirmed request")
    plan, done = link.requests
    assert plan == ("kill", {"pid": 4244, "start_ticks": 111, "signal": "STOP"}, False)
    assert done[1]["pid"] == 4244 and done[1]["signal"] == "STOP" and "expect" in done[1] and done[2]


@in_loop
async def test_the_processes_screen_at_80x24_keeps_pid_and_figures_and_scrolls_to_the_command(
    tmp_path,
) -> None:
    app, _, _ = make_app(str(tmp_path), records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ProcessesScreen), "the processes screen")
        await pilot.pause()
        text = screen_text(app)
        assert "4244" in text and "97.5" in text
        await pilot.press("l", "l", "l", "l", "l", "l")
        await pilot.pause()
        assert "--nproc-per-node=2" in screen_text(app)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProcessesScreen), "back to the room")
