"""The control room's headless parts: the views it computes, the plot, the log tail, the keeper
reader thread, and that none of them needs Textual."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from typing import Any

import pytest
from rich.console import Console

from tests.support.tui_fakes import T0, FakeLink, GiB, MiB, build_state, dead_run_records, healthy_records, rx
from trainroom.core.findings import Finding
from trainroom.core.run.ended import live_attempt
from trainroom.core.run.series import Series
from trainroom.core.run.state import to_snapshot
from trainroom.core.run.view import RunView
from trainroom.core.samples import CgroupMemory, GpuDevice, GpuProcess, GpuSample, HostSample
from trainroom.core.wire import protocol as p
from trainroom.tui import figures, fmt, verdict
from trainroom.tui.evidence import before_after_lines, before_after_rows, plan_lines, soft_wrap
from trainroom.tui.logtail import TrainerLogTail
from trainroom.tui.lossplot import recent, thin
from trainroom.tui.plot import chart
from trainroom.tui.reader import KeeperReader, series_for
from trainroom.tui.screens.finding import evidence_table


def test_dead_run_views_carry_the_figures() -> None:
    st = build_state(dead_run_records())
    now = T0 + 215
    header = verdict.header_view(st, now, connected=True)
    assert header.state == "dead" and header.step == 322 and header.level == "crit"
    # DEAD is the state itself: the header names the next finding.
    assert header.worst_code == "HOST_RAM_LOW" and header.worst_level == "warn" and header.more == 0
    trainer = figures.trainer_view(st, now)
    assert trainer.exit_text == "killed by SIGKILL" and trainer.exit_level == "crit"
    assert figures.cadence_view(st, now).stopped
    rows = verdict.findings_view(st, lambda a: a.upper(), verdict.Situation(connected=True))
    # Most severe first, but the host short of RAM stands in the way of the resume (its load
    # is refused under the floor): its reclaim comes first (`vocab.STANDS_IN_THE_WAY`).
    assert [f.code for f in rows] == ["HOST_RAM_LOW", "DEAD"]
    assert (rows[1].key, rows[1].fix) == ("RESUME", "resume") and rows[0].key == "RECLAIM"
    disk = figures.disk_view(st)
    assert [c.state for c in disk.checkpoints] == ["rejected", "verified"]
    assert disk.checkpoints[1].latest and not disk.checkpoints[0].latest
    assert disk.used_fraction == pytest.approx(0.94)
    host = figures.host_view(st)
    assert host.level == "warn" and host.page_cache == 6 * GiB
    assert not live_attempt(st)


def test_vram_ratio_is_driver_over_allocator_reserved() -> None:
    st = build_state(healthy_records())
    v = figures.vram_view(st)
    assert v.driver_ok and v.per_process
    assert v.run_bytes == 11 * GiB and v.alloc_reserved == 6 * GiB
    assert v.ratio == pytest.approx(11 / 6)
    assert v.util_percent == 97.0 and v.power_w == 151.0


def test_vram_without_per_process_figures_uses_the_device_total() -> None:
    recs = healthy_records()
    recs.append(
        p.ProbeSample(
            t=T0 + 30,
            gpu=GpuSample(
                t=T0 + 30,
                available=True,
                per_process=False,
                devices=[
                    # A zombie context's junk utilisation sample: dropped.
                    GpuDevice(
                        index=0,
                        name="RTX 3060",
                        used_bytes=12 * GiB,
                        total_bytes=12 * GiB,
                        util_percent=37100,
                    )
                ],
                processes=[GpuProcess(pid=4242, used_bytes=None, exists=True, ours=True)],
            ),
        )
    )
    v = figures.vram_view(build_state(recs))
    assert v.run_bytes is None and v.ratio == pytest.approx(2.0)
    assert v.util_percent is None


def test_vram_driver_unavailable_keeps_the_reason() -> None:
    recs = healthy_records()
    recs.append(
        p.ProbeSample(
            t=T0 + 30,
            gpu=GpuSample(
                t=T0 + 30, available=False, reason="driver view unavailable: NVML Shared Library Not Found"
            ),
        )
    )
    v = figures.vram_view(build_state(recs))
    assert not v.driver_ok and v.driver_reason == "NVML Shared Library Not Found"
    assert v.alloc_reserved == 6 * GiB and v.ratio is None


def test_lr_effective_against_requested() -> None:
    recs = healthy_records(lr=1e-4, effective_lr=5e-7)
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="LR_MISMATCH",
                severity="critical",
                first_seen=T0 + 2,
                message="requested 1.00e-04, effective 5.00e-07 (0.005x): scheduler.load_state_dict restored base_lrs",
            )
        )
    )
    v = figures.lr_view(build_state(recs))
    assert v.requested == 1e-4 and v.groups[0].effective == 5e-7
    assert v.groups[0].ratio == pytest.approx(0.005)
    assert v.level == "crit" and "base_lrs" in (v.finding or "")


def test_ranks_headline_is_median_and_worst_with_the_outlier_first() -> None:
    recs = healthy_records(steps=3, ranks=8)
    recs.append(rx(1, 5, T0 + 10, p.Step(step=3, t=T0 + 10, tokens=4 * 8192, loss=40.0, lr=[1e-4])))
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="RANK_OUTLIER",
                severity="critical",
                key="5",
                message="rank 5 loss 40.0 vs median 2.0",
                evidence={"rank": 5},
            )
        )
    )
    v = figures.ranks_view(build_state(recs))
    assert v.worst_rank == 5 and v.worst_loss == 40.0
    assert v.median_loss is not None and v.median_loss < 13
    assert v.rows[0].rank == 5 and v.rows[0].outlier
    assert [r.rank for r in v.rows[1:]] == [0, 1, 2, 3, 4, 6, 7]


def test_loss_view_from_recent_steps_marks_restarts_checkpoints_and_lr_changes() -> None:
    recs = healthy_records(steps=20)
    recs.append(p.CheckpointState(path="/ckpt/step-000010", step=10, state="verified", t=T0 + 7))
    recs.append(p.AttemptEnded(n=1, t=T0 + 12, exit_signal=9))
    recs.append(
        p.AttemptStarted(
            n=2,
            t=T0 + 13,
            pid=5000,
            pgid=5000,
            start_time=T0 + 13,
            argv=["python"],
            cwd="/",
            requested=p.RequestedConfig(lr=1e-4, vocab_size=50257),
        )
    )
    recs.append(rx(2, 0, T0 + 14, p.Step(step=11, t=T0 + 14, tokens=12 * 8192, loss=3.0)))
    recs.append(rx(2, 0, T0 + 15, p.Note(kind="lr-reimposed", t=T0 + 15, step=11)))
    v = figures.loss_view(build_state(recs))
    assert v.x_label == "tokens" and v.ln_v == pytest.approx(math.log(50257))
    kinds = sorted(m.kind for m in v.marks)
    assert kinds == ["checkpoint", "lr-change", "restart"]
    assert v.points[-1] == (12 * 8192, 3.0)


def test_loss_view_reads_the_run_series_with_its_marks_and_spikes() -> None:
    st = build_state(healthy_records(steps=2))
    series = Series()
    series.set_loss_baseline(50257)
    for i in range(5000):  # more points than buckets: min/max buckets keep the spike
        series.observe_step(i, tokens=(i + 1) * 1000, loss=40.0 if i == 2500 else 3.0)
        if i == 100:
            series.mark("checkpoint", step=i)
    v = figures.loss_view(st, series.snapshot())
    assert max(y for _, y in v.points) == 40.0 and min(y for _, y in v.points) == 3.0
    assert [m.kind for m in v.marks] == ["checkpoint"]
    assert v.x_label == "tokens" and v.points[-1][0] > 4_000_000


def test_series_for_a_state_seeds_from_recent_steps_or_takes_the_snapshot() -> None:
    recs = healthy_records(steps=20)
    recs.append(p.CheckpointState(path="/ckpt/step-000010", step=10, state="verified", t=T0 + 7))
    st = build_state(recs)
    seeded = series_for(RunView(st))
    snap = seeded.snapshot()
    assert snap.total_points == 20 and snap.loss_baseline == pytest.approx(math.log(50257))
    assert [(m.kind, m.x) for m in snap.marks] == [("checkpoint", 11 * 8192.0)]
    again = series_for(RunView(st, seeded)).snapshot()
    assert again.total_points == 20 and len(again.marks) == 1


def test_loss_view_with_no_series_and_no_steps_is_empty() -> None:
    st = build_state(healthy_records(steps=0))
    v = figures.loss_view(st)
    assert v.points == () and v.median is None


def test_cadence_age_against_the_stall_bound() -> None:
    st = build_state(healthy_records(steps=40))
    last = st.last_step_t()
    assert last is not None
    v = figures.cadence_view(st, last + 7.0)
    assert v.interval_s == pytest.approx(0.5)
    assert v.steps_per_s == pytest.approx(2.0)
    assert v.bound_s == 10.0  # max(3 x 0.5 s, 10 s)
    assert v.last_step_age_s == pytest.approx(7.0) and v.level == "warn"
    assert len(v.intervals) == 39


def test_chart_draws_the_curve_the_guide_and_the_marks() -> None:
    pts = [(float(i), 11.0 - i) for i in range(10)]
    c = chart(pts, cols=20, rows=5, guides={"lnv": 10.83}, marks=[(0.0, "restart"), (9.0, "checkpoint")])
    kinds = {k for row in c.rows for _, k in row}
    assert {"curve", "lnv"} <= kinds
    assert c.rows[0][0][1] in ("curve", "lnv")  # the top left holds the first point or ln V
    assert c.marks[0] == ("R", "restart") and c.marks[-1] == ("c", "checkpoint")
    assert any(label == "10.8" for _, label in c.y_labels)
    assert c.y_max > 10.83 > c.y_min


def test_the_y_range_is_the_curves_own_and_a_log_scale_spreads_late_training() -> None:
    """Late training far below ln V: the guide does not stretch the range (it is left out),
    and a log scale gives the low values rows of their own."""
    pts = [(float(i), 2.0 + 0.001 * (i % 7)) for i in range(50)]
    c = chart(pts, cols=20, rows=6, guides={"lnv": 10.83})
    assert c.y_max < 2.1 and all(k != "lnv" for row in c.rows for _, k in row)
    assert not any(label == "10.8" for _, label in c.y_labels)
    decay = [(float(i), 10.0 * 0.9**i) for i in range(60)]  # 10 down to ~0.02
    lin, log = chart(decay, cols=30, rows=8), chart(decay, cols=30, rows=8, log_y=True)

    def rows_hit(ch: Any, xs: range) -> set[int]:
        return {
            r for r, row in enumerate(ch.rows) for c, (_, k) in enumerate(row) if k == "curve" and c in xs
        }

    late = range(15, 30)  # the second half of the run
    assert len(rows_hit(log, late)) > len(rows_hit(lin, late))
    # Labels are values, not logs: the log scale's bottom is above zero; the linear one's is
    # zero, never the negative tick its padding would give a loss that is never negative.
    assert float(log.y_labels[-1][1]) > 0 == float(lin.y_labels[-1][1])
    assert float(log.y_labels[0][1]) > 10.0


def test_the_plot_thins_the_whole_run_evenly_and_keeps_spikes() -> None:
    pts = [(float(i), 3.0) for i in range(10_000)]
    pts[123] = (123.0, 50.0)  # a spike early in the run
    kept = thin(pts, 400)
    assert len(kept) <= 402 and kept[0][0] == 0.0 and kept[-1][0] == 9_999.0  # start and end stay
    assert (123.0, 50.0) in kept
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)
    tail = recent(tuple(pts), 0.2)
    assert tail[0][0] >= 7_999 and tail[-1][0] == 9_999.0


def test_chart_of_a_flat_line_and_of_nothing() -> None:
    flat = chart([(0, 2.0), (1, 2.0)], cols=10, rows=3)
    assert flat.y_max > 2.0 > flat.y_min
    empty = chart([], cols=10, rows=3)
    assert all(k == "blank" for row in empty.rows for _, k in row)


def test_fmt_figures() -> None:
    assert fmt.nbytes(12 * GiB) == "12.0 GiB" and fmt.nbytes(400 * MiB) == "400 MiB"
    assert fmt.duration(187) == "3m07s" and fmt.duration(4.25) == "4.2 s"
    assert fmt.bar(0.5, 4) == "██░░" and fmt.bar(None, 3) == "░░░"
    assert fmt.lr(5e-7) == "5.00e-07" and fmt.loss(float("nan")) == "nan"


def test_evidence_lines_show_the_exact_target_and_before_after() -> None:
    lines = plan_lines(
        {
            "pgid": 4242,
            "members": [{"pid": 4242, "state": "R", "cmdline": ["python", "t.py"]}],
            "freed_bytes": 4 * GiB,
        }
    )
    assert lines == [
        "process group: 4242",
        "processes (1):",
        "  pid 4242  ·  state R  ·  python t.py",
        "freed: 4.0 GiB",
    ]
    assert before_after_lines({"vram_used_bytes": 12 * GiB}, {"vram_used_bytes": 400 * MiB}) == [
        "VRAM used: 12.0 GiB -> 400 MiB"
    ]


def test_plans_read_in_words_the_target_first_without_bookkeeping() -> None:
    """Not bookkeeping: `leader_start_ticks: 509068`, `bytes_freed: — -> 23941779`, `ok: — ->
    yes`, the resume argv below the fold."""
    plan = {
        "ok": True,
        "attempt": 2,
        "died_at_step": 25,
        "steps_lost": 5,
        "checkpoint_bytes": 3 * GiB,
        "templated": True,
        "argv": ["python", "train.py", "--init_from=resume"],
        "checkpoint": "/ckpt/step-000020",
        "leader_start_ticks": 509068,
        "leader_start_time": T0,
    }
    lines = plan_lines(plan)
    assert lines[:2] == ["command: python train.py --init_from=resume", "checkpoint: /ckpt/step-000020"]
    assert "died at step: 25" in lines and "steps lost: 5" in lines and "checkpoint size: 3.0 GiB" in lines
    assert not any("ticks" in x or "ok" in x.split(":")[0] or "templated" in x for x in lines)
    rows = before_after_rows({"ok": False, "bytes_freed": None}, {"ok": True, "bytes_freed": 23941779})
    assert rows == [("freed", "—", "22.8 MiB")]


def test_a_long_path_wraps_after_a_slash_never_mid_name() -> None:
    path = "checkpoint: /home/someone/projects/nanogpt/out/runs/20261203-121511/step-000300"
    lines = soft_wrap(path, 40)
    assert all(len(x) <= 40 for x in lines) and len(lines) > 1
    assert "".join(x.removeprefix("  ") for x in lines) == path
    assert all(x.rstrip().endswith(("/", ":")) for x in lines[:-1]), lines


def test_log_tail_follows_appends_partial_lines_and_truncation(tmp_path) -> None:
    log = tmp_path / "trainer.log"
    tail = TrainerLogTail(log, lambda lines: None, max_lines=3)
    assert not tail.poll()  # no file yet
    log.write_bytes(b"one\ntwo\nthree\nfour\npart")
    assert tail.poll()
    assert tail.lines == ("two", "three", "four", "part")
    with open(log, "ab") as f:
        f.write(b"ial\r50%\r100%\n\xc3")  # a progress bar, then half a UTF-8 character
    assert tail.poll()
    assert tail.lines == ("three", "four", "100%")
    with open(log, "ab") as f:
        f.write(b"\xa9t\xc3\xa9\n")
    tail.poll()
    assert tail.lines[-1] == "été"
    log.write_bytes(b"fresh\n")  # truncated and rewritten
    assert tail.poll()
    assert tail.lines == ("fresh",)


def test_log_tail_thread_reports_and_stops(tmp_path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("hello\n")
    got = threading.Event()
    seen: list[tuple[str, ...]] = []

    def on_lines(lines: tuple[str, ...]) -> None:
        seen.append(lines)
        got.set()

    tail = TrainerLogTail(log, on_lines, interval_s=0.01)
    tail.start()
    try:
        assert got.wait(10)
    finally:
        tail.stop()
    assert not tail.is_alive()
    assert seen[0] == ("hello",)


def test_reader_folds_deltas_under_the_lock_and_reports_the_keeper_gone() -> None:
    st = build_state(healthy_records(steps=5))
    link = FakeLink(st)
    lock = threading.Lock()
    states: list = []
    series: list = []
    changes: list[int] = []
    gone: list[tuple[str, float]] = []
    done = threading.Event()
    reader = KeeperReader(
        link,
        lock,
        on_snapshot=lambda st, se: (states.append(st), series.append(se)),
        on_change=lambda urgent: changes.append(urgent),
        on_gone=lambda reason, t: (gone.append((reason, t)), done.set()),
        clock=lambda: T0 + 99,
    )
    for i in range(5, 15):
        link.push([rx(1, 0, T0 + 10 + i, p.Step(step=i, t=T0 + 10 + i, loss=2.0))])
    link.go_away("keeper gone: connection reset by peer")
    reader.start()
    assert done.wait(10)
    reader.join(5)
    assert states[0] is not st  # a decoded copy, as from the wire
    assert states[0].current_step() == 14 and states[0].steps_total == 15
    assert changes == [False] * 10 and reader.records == 10  # steps: routine, not urgent
    assert series[0].snapshot().total_points == 15  # 5 seeded from the snapshot, 10 folded live
    assert gone == [("keeper gone: connection reset by peer", T0 + 99)]


def test_reader_stop_is_quiet() -> None:
    link = FakeLink(build_state(healthy_records(steps=1)))
    gone: list = []
    reader = KeeperReader(
        link,
        threading.Lock(),
        on_snapshot=lambda st, se: None,
        on_change=lambda urgent: None,
        on_gone=lambda *a: gone.append(a),
    )
    reader.start()
    assert link.subscribed.wait(10)
    reader.stop()
    assert not reader.is_alive() and link.closed and gone == []


def test_headless_modules_do_not_import_textual() -> None:
    code = (
        "import sys\n"
        "import trainroom.tui.figures, trainroom.tui.reader, trainroom.tui.logtail, trainroom.tui.link\n"
        "import trainroom.tui.plot, trainroom.tui.evidence, trainroom.tui.fmt\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'torch'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _stub_keeper(path: str, snapshot_state, deltas: list[list]) -> tuple[threading.Thread, threading.Event]:
    """A real Unix socket speaking the keeper's side of the protocol: snapshot, deltas, then it
    holds the connection open (a keeper with nothing more to say)."""
    import socket

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
        while not reader.feed(conn.recv(65536)):
            pass
        conn.sendall(p.frame(p.Snapshot(v=1, state=to_snapshot(snapshot_state))))
        for batch in deltas:
            conn.sendall(p.frame(p.Delta(records=batch)))
        done.wait(30)
        conn.close()
        server.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t, done


def test_reader_over_a_real_socket_with_the_real_client_stops_when_asked(tmp_path) -> None:
    from trainroom.core.run.client import KeeperClient

    sock = str(tmp_path / "keeper.sock")
    st = build_state(healthy_records(steps=3))
    deltas = [[rx(1, 0, T0 + 10 + i, p.Step(step=i, t=T0 + 10 + i, loss=2.0))] for i in range(3, 8)]
    server, release = _stub_keeper(sock, st, deltas)
    lock = threading.Lock()
    got: list = []
    folded = threading.Event()

    def on_change(urgent: bool) -> None:
        with lock:
            if got and got[0].current_step() == 7:
                folded.set()

    reader = KeeperReader(
        KeeperClient(sock),
        lock,
        on_snapshot=lambda s, se: got.append(s),
        on_change=on_change,
        on_gone=lambda *a: got.append(a),
    )
    reader.start()
    try:
        assert folded.wait(10)
        # Wait until the reader sits in the client's blocking recv (its innermost frame is the
        # client's _recv and stays on one instruction), then stop: a close alone would leave it
        # there; the stop must wake it.
        still = 0
        last = None
        for _ in range(2000):
            frame = sys._current_frames().get(reader.ident or -1)
            here = (frame.f_code.co_name, frame.f_lasti) if frame is not None else None
            still = still + 1 if here is not None and here[0] == "_recv" and here == last else 0
            last = here
            if still >= 20:
                break
            threading.Event().wait(0.005)
        else:
            raise AssertionError("the reader never blocked in recv")
        reader.stop(timeout=5)
        assert not reader.is_alive()
    finally:
        release.set()
        server.join(5)
    assert len(got) == 1  # a stop asked for is not "the keeper went away"


def test_host_view_reads_the_host_probe_and_says_when_it_failed() -> None:
    recs = healthy_records(steps=1)
    recs.append(
        p.ProbeSample(
            t=T0 + 9,
            host=HostSample(
                t=T0 + 9,
                available=True,
                mem_total_bytes=32 * GiB,
                mem_available_bytes=20 * GiB,
                page_cache_bytes=6 * GiB,
                effective_available_bytes=2 * GiB,
                wsl=True,
                cgroup=CgroupMemory(
                    version=2,
                    path="/",
                    dir="/sys/fs/cgroup",
                    limit_bytes=16 * GiB,
                    usage_bytes=15 * GiB,
                    available_bytes=2 * GiB,
                ),
            ),
        )
    )
    v = figures.host_view(build_state(recs))
    assert (v.available, v.page_cache, v.cgroup_limit, v.cgroup_usage) == (
        20 * GiB,
        6 * GiB,
        16 * GiB,
        15 * GiB,
    )
    assert v.effective_available == 2 * GiB and v.wsl and v.reason == ""
    failed = HostSample(
        t=T0 + 10, available=False, reason="host probe failed: PermissionError: /proc/meminfo"
    )
    recs.append(p.ProbeSample(t=T0 + 10, host=failed))
    v = figures.host_view(build_state(recs))
    assert v.reason == "host probe failed: PermissionError: /proc/meminfo" and v.level == "dim"


def test_a_deaths_signal_is_one_row_with_its_name_and_number() -> None:
    console = Console(width=60, record=True, color_system=None)
    console.print(
        evidence_table((("attempt", 1), ("exit_signal", 9), ("signal", "SIGKILL"), ("last_step", 120)))
    )
    rows = [" ".join(line.split()) for line in console.export_text().splitlines() if line.strip()]
    assert rows == ["attempt 1", "exit signal SIGKILL (9)", "last step 120"]
    # Without the number, the name alone is still shown.
    console = Console(width=60, record=True, color_system=None)
    console.print(evidence_table((("signal", "SIGTERM"),)))
    assert " ".join(console.export_text().split()) == "signal SIGTERM"


def test_an_attached_trainer_ran_since_its_process_began_not_since_the_attach() -> None:
    import msgspec

    st = build_state(dead_run_records())
    a = st.attempts[-1]
    ran = figures.trainer_view(st, T0 + 215).uptime_s
    assert ran == round((a.ended_at or 0) - a.started_at)
    # attached 600 s after the trainer's process began: it ran that much longer
    st.attempts[-1] = msgspec.structs.replace(a, attached=True, start_time=a.started_at - 600)
    assert figures.trainer_view(st, T0 + 215).uptime_s == ran + 600
