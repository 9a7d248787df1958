"""The panels' pure figures: the VRAM title at a width, the GPU's process rows, the live stall
reason, a hung trainer's words, the disk guard's count, the key strip's priority, the loss axis's
floor, and the words of a run whose reporter has not connected yet."""

from __future__ import annotations

from typing import Any

from tests.support.run_builder import RunBuilder
from tests.support.tui_fakes import T0, GiB, build_state, healthy_records
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample
from trainroom.core.wire import protocol as p
from trainroom.tui import figures, verdict
from trainroom.tui.plot import chart
from trainroom.tui.verdict import FindingRow
from trainroom.tui.widgets.disk import checkpoints_subtitle, disk_title
from trainroom.tui.widgets.keystrip import KeyStripView, StripKey, fit_keys, key_strip_view


def test_the_vram_title_drops_the_vendor_then_the_middle_never_the_end() -> None:
    name = "NVIDIA GeForce RTX 3060 (fake)"
    assert figures.vram_title(12 * GiB, name, 80) == f"VRAM 12.0 GiB · {name}"
    assert figures.vram_title(12 * GiB, name, 33) == "VRAM 12.0 GiB · RTX 3060 (fake)"
    cut = figures.vram_title(12 * GiB, "NVIDIA H200 NVL Extra Long Name (fake)", 34)
    assert cut.endswith("… (fake)") and len(cut) <= 34, cut
    assert figures.vram_title(80 * GiB, "NVIDIA A100-SXM4-80GB (+3)", 30).endswith("(+3)")
    assert figures.vram_title(None, "", 30) == "VRAM"


def test_the_gpu_process_rows_put_the_runs_own_first_by_rank() -> None:
    recs: list[Any] = healthy_records(steps=3, ranks=2)
    recs.append(
        p.ProbeSample(
            t=T0 + 5,
            gpu=GpuSample(
                t=T0 + 5,
                available=True,
                per_process=True,
                devices=[GpuDevice(index=0, name="x", used_bytes=9 * GiB, total_bytes=12 * GiB)],
                processes=[
                    GpuProcess(pid=9000, used_bytes=3 * GiB),
                    GpuProcess(pid=4243, used_bytes=1 * GiB, ours=True),
                    GpuProcess(pid=4242, used_bytes=2 * GiB, ours=True),
                    GpuProcess(pid=9100, used_bytes=4 * GiB, exists=False),
                ],
            ),
        )
    )
    rows = figures.gpu_process_rows(build_state(recs))
    assert [(r.pid, r.who) for r in rows] == [
        (4242, "this run · rank 0"),
        (4243, "this run · rank 1"),
        (9100, "gone: memory left behind"),
        (9000, "another process"),
    ]
    assert figures.vram_view(build_state(recs)).processes == rows


def hung_state(reason: str = "alive, heartbeats flowing, no step within 10 s") -> Any:
    recs: list[Any] = healthy_records(steps=10)  # the last step at T0 + 5.5
    recs.append(p.RunStatus(t=T0 + 20, state="hung", reason=reason))
    return build_state(recs)


def test_a_stall_reason_ages_with_the_clock() -> None:
    st = hung_state()
    assert verdict.live_reason(st, T0 + 30) == "alive, heartbeats flowing, no step for 24 s (bound 10 s)"
    assert verdict.live_reason(st, T0 + 40.5) == "alive, heartbeats flowing, no step for 35 s (bound 10 s)"
    assert verdict.header_view(st, T0 + 40.5, True).reason.endswith("no step for 35 s (bound 10 s)")
    other = hung_state("main thread stopped (SIGSTOP)")
    assert (
        verdict.live_reason(other, T0 + 30) == "main thread stopped (SIGSTOP); no step for 24 s (bound 10 s)"
    )
    running = build_state(healthy_records(steps=10))
    assert verdict.live_reason(running, T0 + 30) == running.status_reason


def test_a_hung_trainer_is_said_hung_with_its_rates_as_history() -> None:
    st = hung_state()
    trainer = figures.trainer_view(st, T0 + 30)
    assert trainer.exit_text == "hung: last step 24 s ago" and trainer.exit_level == "crit" and trainer.alive
    cadence = figures.cadence_view(st, T0 + 30)
    assert cadence.halted == "hung" and cadence.level == "crit"
    healthy = figures.cadence_view(build_state(healthy_records(steps=10)), T0 + 6)
    assert (
        healthy.halted == ""
        and figures.trainer_view(build_state(healthy_records()), T0).exit_text == "running"
    )


def test_the_disk_guard_says_what_its_counts_are() -> None:
    assert disk_title(92, 0) == "disk guard · 92 checkpoints"
    assert disk_title(1, 3) == "disk guard · 1 checkpoint, 3 pruned"
    assert disk_title(0, 0) == "disk guard"
    assert checkpoints_subtitle(0, 5, 92) == "checkpoints 1–5 of 92, newest first"
    assert checkpoints_subtitle(0, 2, 2) == ""


def row(key: str, action: str, fix: str) -> FindingRow:
    return FindingRow(
        ident=action.upper(),
        code=action.upper(),
        severity="critical",
        level="crit",
        message="",
        action=action,
        fix=fix,
        key=key,
        why_not=None,
        targeted=True,
        first_seen=T0,
        last_seen=T0,
        evidence=(),
    )


def test_the_key_strip_fills_by_priority_fixes_then_moving_then_the_rest() -> None:
    keys = {"kill": "^k", "reclaim": "C", "dump": "d", "next_panel": "tab", "search": "/", "runs": "o"}
    keys |= {"zoom": "z", "help": "?", "quit": "q", "bench": "b", "prune": "P"}
    view = key_strip_view(
        [row("^k", "kill", "kill pid 4974, the second trainer")],
        {"reclaim": None, "dump": None, "bench": None, "kill": None, "prune": "no checkpoints"},
        lambda a: keys.get(a, a),
    )
    assert view.keys[0] == StripKey("^k", "kill pid 4974, the second trainer", "kill")
    assert [(k.key, k.what) for k in view.keys[1:5]] == [
        ("tab", "panels"),
        ("/", "search"),
        ("o", "runs"),
        ("z", "zoom"),
    ]
    assert "P" not in [k.key for k in view.keys]  # cannot act: not offered
    wide = fit_keys(view, 160)
    assert wide[0] == ("^k", "kill pid 4974, the second trainer") and ("C", "reclaim") in wide
    narrow = fit_keys(view, 78)
    assert narrow[:5] == [("^k", "kill"), ("tab", "panels"), ("/", "search"), ("o", "runs"), ("z", "zoom")]
    assert narrow[-2:] == [("?", "help"), ("q", "quit")]
    tight = fit_keys(view, 50)
    assert ("C", "reclaim") not in tight and ("tab", "panels") in tight
    # A plain (key, what) pair, as the job screen gives, is an entry without a short word.
    assert fit_keys(KeyStripView(keys=(("j", "down"),), tail=(("q", "quit"),)), 40) == [
        ("j", "down"),
        ("q", "quit"),
    ]


def test_a_loss_near_zero_gets_no_negative_tick() -> None:
    pts = [(float(i), 0.2 * 0.8**i) for i in range(40)]
    c = chart(pts, cols=30, rows=8)
    assert c.y_min == 0.0 and all(not label.startswith("-") for _, label in c.y_labels)
    flat = chart([(0.0, 0.0), (1.0, 0.0)], cols=10, rows=4)
    assert flat.y_min == 0.0 and all(not label.startswith("-") for _, label in flat.y_labels)
    signed = chart([(0.0, -1.0), (1.0, 1.0)], cols=10, rows=4)
    assert signed.y_min < -1.0  # a value that can be negative keeps its padding


def test_an_instrumented_run_starting_is_not_called_uninstrumented() -> None:
    b = RunBuilder()
    b.start(instrumented=False)  # the reporter has not said hello yet
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now + 5)
    assert v.state == "starting" and "uninstrumented" not in v.reason
    assert "waiting for the first report" in v.reason
