"""core/run/figures.py: the figures every reader shows, derived once from the run. The watchdog,
`status` and the control room read these same functions, so each test here also checks that two
readers agree."""

from __future__ import annotations

import math

import pytest

from tests.support.run_builder import RunBuilder
from tests.support.tui_fakes import T0, build_state, healthy_records
from trainroom.core.configuration.config import Thresholds
from trainroom.core.health.gpu import ghost_measure
from trainroom.core.health.watchdog import WatchContext
from trainroom.core.run import figures as fig
from trainroom.core.run.status import status_dict
from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample
from trainroom.core.wire import protocol as p
from trainroom.tui import figures as views

GIB = 1 << 30


def test_ln_v_and_the_headline_loss() -> None:
    assert fig.ln_v(50257) == pytest.approx(10.8249, abs=1e-4)
    assert fig.ln_v(None) is None and fig.ln_v(1) is None
    assert fig.headline_loss({0: 2.0, 1: 2.2, 2: 9.0}) == (2.2, 2, 9.0)
    med, worst_rank, worst = fig.headline_loss({0: 2.0, 1: math.inf, 2: 3.0, 3: None})
    assert med == 2.5 and worst_rank == 1 and worst == math.inf  # a non-finite rank is the worst


def test_the_stall_bound_is_the_watchdogs_by_the_journaled_thresholds() -> None:
    b = RunBuilder()
    b.apply(p.KeeperStarted(t=b.now, pid=1, thresholds=Thresholds(stall_floor_s=30.0, start_grace_s=60.0)))
    b.start()
    assert fig.stall_bound(b.run) == (60.0, "train")  # no interval yet: the warm-up bound
    b.steps(40, interval=0.5)
    th = b.run.thresholds
    median = fig.median_interval(b.run, th)
    assert median == pytest.approx(0.5)
    assert fig.stall_bound(b.run) == (30.0, "train") == (fig.progress_bound(median, th), "train")
    # The control room draws the age against the same bound (not a copy of the default floor).
    assert views.cadence_view(b.run, b.now + 1).bound_s == 30.0
    b.rx(p.Phase(name="checkpoint-save", t=b.now))
    assert fig.stall_bound(b.run) == (900.0, "checkpoint-save")  # the configured phase bound


def test_step_age_stops_growing_once_the_attempt_ended() -> None:
    b = RunBuilder()
    b.start()
    b.steps(5)
    last = b.now
    assert fig.step_age(b.run, last + 4.0) == pytest.approx(4.0)
    b.now = last + 2.0
    b.end(exit_signal=9)
    assert fig.step_age(b.run, last + 100.0) == pytest.approx(2.0)
    assert status_dict(b.run, now=last + 100.0)["step_age_s"] == pytest.approx(2.0)


def _gpu(per_process: bool) -> GpuSample:
    return GpuSample(
        t=1.0,
        available=True,
        per_process=per_process,
        pid_namespace="host",
        devices=[GpuDevice(index=0, name="RTX 3060", used_bytes=10 * GIB, total_bytes=12 * GIB)],
        processes=[
            GpuProcess(pid=4242, used_bytes=8 * GIB if per_process else None, ours=True),
            GpuProcess(pid=777, used_bytes=GIB if per_process else None, exists=True),
        ],
    )


@pytest.mark.parametrize(("per_process", "owned", "basis"), [(True, 8, "per-process"), (False, 10, "device")])
def test_vram_owned_is_one_figure_for_status_the_panel_and_ghost_memory(
    per_process: bool, owned: int, basis: str
) -> None:
    b = RunBuilder()
    b.start()
    b.steps(5, reserved=4 * GIB)
    b.apply(p.ProbeSample(t=b.now, gpu=_gpu(per_process)))
    v = fig.vram(b.run)
    assert v.owned_bytes == owned * GIB and v.basis == basis and v.ratio == pytest.approx(owned / 4)
    assert v.run_bytes == (owned * GIB if per_process else None)
    panel = views.vram_view(b.run)
    assert panel.ratio == v.ratio and panel.run_bytes == v.run_bytes and panel.alloc_reserved == 4 * GIB
    vram = status_dict(b.run, now=b.now)["vram"]
    assert vram["driver_owned_bytes"] == v.owned_bytes and vram["driver_over_allocator"] == v.ratio
    assert vram["allocator_reserved_bytes"] == 4 * GIB and vram["driver_run_bytes"] == v.run_bytes
    ghost = ghost_measure(b.run, WatchContext(alive=True, gpu=b.run.probe.gpu if b.run.probe else None))
    assert ghost == v


def test_device_basis_leaves_out_what_other_live_processes_are_known_to_hold() -> None:
    gpu = GpuSample(
        t=1.0,
        available=True,
        per_process=True,
        devices=[GpuDevice(index=0, used_bytes=10 * GIB)],
        processes=[GpuProcess(pid=4242, used_bytes=None, ours=True), GpuProcess(pid=9, used_bytes=3 * GIB)],
    )
    v = fig.vram_figures(gpu, [])
    assert v.basis == "device" and v.owned_bytes == 7 * GIB and v.run_bytes is None and v.ratio is None


def test_no_probe_and_an_unavailable_driver_keep_the_allocator_figures() -> None:
    st = build_state(healthy_records(steps=3)[:-1])  # no ProbeSample
    v = fig.vram(st)
    assert not v.available and v.reason == "no probe yet" and v.reserved_bytes == 6 * GIB and v.ratio is None
    st.apply(
        p.ProbeSample(t=T0 + 9, gpu=GpuSample(t=T0 + 9, available=False, reason="driver view unavailable: x"))
    )
    v = fig.vram(st)
    assert not v.available and v.reason == "driver view unavailable: x" and v.peak_bytes == 7 * GIB


def test_allocator_figures_end_with_the_attempt() -> None:
    # What the H200 showed after a kill: the dead trainer's allocator bytes set against the
    # device's idle 615 MiB gave driver_over_allocator 0.33. Once the attempt ends the allocator
    # side is unknown: the ratio and the allocator fields are null; the run keeps the last values.
    b = RunBuilder()
    b.start()
    b.steps(5, reserved=2 * GIB)
    b.apply(p.ProbeSample(t=b.now, gpu=_gpu(True)))
    assert status_dict(b.run, now=b.now)["vram"]["driver_over_allocator"] == pytest.approx(4.0)
    b.end(exit_signal=9)
    idle = GpuSample(
        t=b.now,
        available=True,
        per_process=None,
        pid_namespace="host",
        devices=[GpuDevice(index=0, name="NVIDIA H200", used_bytes=615 << 20, total_bytes=141 * GIB)],
    )
    b.apply(p.ProbeSample(t=b.now, gpu=idle))
    vram = status_dict(b.run, now=b.now)["vram"]
    assert vram["driver_over_allocator"] is None
    assert vram["allocator_reserved_bytes"] is None and vram["allocator_allocated_bytes"] is None
    assert vram["driver_used_bytes"] == 615 << 20  # the driver's side is still the device's now
    assert views.vram_view(b.run).ratio is None
    assert b.run.ranks[0].alloc_reserved == 2 * GIB  # the last report stays in the run's history


def test_status_says_a_dead_run_s_pace_as_it_was_and_when_it_ended_never_as_now() -> None:
    from trainroom.core.run.status_text import status_lines

    b = RunBuilder()
    b.start()
    b.steps(40)
    last = b.now
    b.now = last + 0.04
    b.end(exit_signal=9)
    d = status_dict(b.run, now=last + 22 * 60)
    assert d["steps_per_s"] is None and d["steps_per_s_last"] > 0
    assert d["ended_s_ago"] == pytest.approx(22 * 60 - 0.04)
    line = status_lines(d)[1]
    assert "ended 21m59s ago, last step 0.0 s before the end  was " in line and " age " not in line, line


def test_a_hung_run_has_no_live_pace() -> None:
    from trainroom.core.run.status_text import status_lines

    b = RunBuilder()
    b.start()
    b.steps(40)
    b.run.status, b.run.status_reason = "hung", "stopped (SIGSTOP)"
    d = status_dict(b.run, now=b.now + 60)
    assert d["steps_per_s"] is None and d["steps_per_s_last"] > 0 and d["ended_s_ago"] is None
    assert "age 60.0 s  was " in status_lines(d)[1]


def test_status_names_the_device_s_vram_and_the_run_s_apart() -> None:
    from trainroom.core.run.status_text import status_lines

    b = RunBuilder()
    b.start()
    b.steps(5)
    d = status_dict(b.run, now=b.now)
    gib = 1 << 30
    d["vram"] |= {
        "driver_available": True,
        "driver_used_bytes": int(11.3 * gib),
        "driver_total_bytes": 12 * gib,
        "driver_run_bytes": int(4.3 * gib),
    }
    (line,) = [x for x in status_lines(d) if x.startswith("  vram ")]
    assert line.startswith("  vram device 11.3 GiB of 12.0 GiB used, this run 4.3 GiB  allocator "), line
