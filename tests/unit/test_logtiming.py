"""steps/s of an uninstrumented run from the trainer's own timing on its log lines (core/logs/logtiming):
nanoGPT's iteration times, a tqdm or Lightning bar's rate, a leading timestamp; else the steps
between records over the times they were read, each read time counted once (a block-buffered
stdout brings many lines at one read). Real lines: the captured HF and Lightning logs, nanoGPT's
and tqdm's formats as their sources print them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.run_builder import RunBuilder
from trainroom.core.journal import stepbatch
from trainroom.core.keeper.logtail import LogTail
from trainroom.core.logs.logformats import LogHints, LogStep
from trainroom.core.logs.logtiming import bar_rate, iteration_ms, leading_stamp
from trainroom.core.run import figures as fig
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.wire import protocol as p
from trainroom.tui import figures as views

CAPTURED = Path(__file__).resolve().parents[1] / "support" / "trainers" / "captured"


def test_the_figures_on_real_lines() -> None:
    # nanoGPT's train.py: f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%"
    assert iteration_ms("iter 100: loss 2.3456, time 129.87ms, mfu 12.34%") == 129.87
    assert iteration_ms("iter 0: loss 4.2874, time 35312.50ms, mfu -100.00%") == 35312.5
    assert iteration_ms("iter 100: loss 2.3456") is None
    # tqdm: `n/total [elapsed<left, rate]`, the rate `s/it` under one a second.
    assert bar_rate(" 45%|████▌     | 45/100 [00:05<00:06,  8.20it/s, loss=2.31, lr=3e-4]") == 8.2
    assert bar_rate(" 45%|████▌     | 45/100 [01:05<01:06,  1.25s/it]") == 0.8
    assert bar_rate("  0%|          | 0/60 [00:00<?, ?it/s]") is None
    assert bar_rate("Epoch 0/-2 ━━━━━━━━ 1/40 0:00:00 • -:--:-- 0.00it/s v_num: 0.000") is None
    assert bar_rate("Epoch 0/-2 ━━━━━━━━ 2/40 0:00:00 • 0:00:01 47.10it/s v_num: 0.000") == 47.1
    # `logging`'s asctime and ISO 8601; only differences are used.
    a = leading_stamp("2026-12-04 10:00:00,123 INFO train: step=10, loss=2.3100")
    b = leading_stamp("[2026-12-04T10:00:01.623Z] step 20 loss 2.1")
    assert a is not None and b is not None and b - a == pytest.approx(1.5)
    assert leading_stamp("step 10 loss 2.31 at 2026-12-04 10:00:00") is None
    assert leading_stamp("2026-13-45 10:00:00 step 1") is None  # no such date: no time


def test_the_figures_stay_linear_on_hostile_lines() -> None:
    """A megabyte of digits or of `it/s` is read in one pass (a timed check is scripts/bench_patterns.py)."""
    for line in ("9" * (1 << 20), "1it/s" * (1 << 18), ", time " + "9" * (1 << 20) + "ms", "2026-" * 300_000):
        bar_rate(line), iteration_ms(line), leading_stamp(line)
    assert bar_rate("9" * 40 + "it/s") is None  # a number longer than the window is no rate


def read(tmp_path: Path, text: str, hints: LogHints | None = None) -> list[LogStep]:
    log = tmp_path / f"trainer-{len(list(tmp_path.iterdir()))}.log"
    tail = LogTail(log, None, hints)  # made before the file: reads it from its start
    log.write_text(text)
    return tail.read() + tail.read(final=True)


def test_a_nanogpt_line_times_its_steps_by_its_iteration_times(tmp_path: Path) -> None:
    """Every 10th iteration's duration: the steps covered over their sampled time, without the
    first line's (the warm-up) and an outlier's (an eval inside one sampled iteration)."""
    ms = [9000.0] + [125.0] * 20 + [5000.0] + [125.0] * 10
    lines = "".join(f"iter {i * 10}: loss 2.5, time {t:.2f}ms, mfu 1.00%\n" for i, t in enumerate(ms))
    steps = read(tmp_path, lines)
    assert [s.step for s in steps] == [i * 10 for i in range(len(ms))]
    assert steps[0].rate is None  # iter 0: imports, compile, the first eval
    assert all(s.rate == pytest.approx(8.0) for s in steps[1:])
    assert {s.rate_from for s in steps[1:]} == {"iteration times"}
    # Varying step times: the steps over the time they took, not a median or a mean of rates.
    varied = read(
        tmp_path, "".join(f"iter {i}: loss 2.5, time {t}ms\n" for i, t in enumerate([1, 100, 300] * 8))
    )
    assert varied[-1].rate == pytest.approx(1000 / ((7 * 1 + 8 * 100 + 8 * 300) / 23))


def test_a_bars_pace_is_its_count_over_its_elapsed_time_once_that_spans_10_s(tmp_path: Path) -> None:
    """tqdm's `it/s` is an average of rates (9.85 shown for a true 8.2 when step times vary): its
    count over its elapsed time is the pace, once the records span enough whole seconds."""
    rates = [f"{40 if n % 20 else 2}.00it/s" for n in range(300)]
    bar = "".join(
        f" 50%|#####     | {n}/300 [00:{n // 10:02d}<00:10, {rates[n]}, loss=2.5]\r" for n in range(1, 300)
    )
    steps = read(tmp_path, bar)
    early = [s for s in steps if s.step < 100]
    late = [s for s in steps if s.step > 150]
    assert early and all(s.rate in (40.0, 2.0) for s in early)  # under 10 s: the bar's own figure
    assert late and all(s.rate == pytest.approx(10.0, rel=0.1) for s in late)
    assert {s.rate_from for s in steps} == {"bar rate"}


def test_the_bars_rate_times_hf_and_lightning_steps(tmp_path: Path) -> None:
    hf = read(tmp_path, (CAPTURED / "hf_trainer.log").read_text())
    timed = [s for s in hf if s.rate is not None]
    assert len(timed) > len(hf) // 2 and {s.rate_from for s in timed} == {"bar rate"}
    assert all(100 < (s.rate or 0) < 400 for s in timed)  # the captured run's 168-192 it/s
    # Lightning counts batches: under accumulate_grad_batches=4 a step is 4 of them.
    light = read(tmp_path, (CAPTURED / "lightning_tqdm.log").read_text())
    light4 = read(tmp_path, (CAPTURED / "lightning_tqdm.log").read_text(), LogHints(accumulate=4))
    r1 = [s.rate for s in light if s.rate is not None]
    r4 = [s.rate for s in light4 if s.rate is not None]
    assert r1 and r4 and fig.statistics.median(r4) == pytest.approx(fig.statistics.median(r1) / 4, rel=0.2)


def test_timestamps_time_the_steps_between_records(tmp_path: Path) -> None:
    lines = "".join(
        f"2026-12-04 10:00:{i // 10:02d},{(i % 10) * 100:03d} INFO train: step={i * 5}, loss=2.3\n"
        for i in range(1, 30)
    )
    steps = read(tmp_path, lines)
    timed = [s for s in steps if s.rate is not None]
    assert len(timed) == len(steps) - 1 and all(s.rate == pytest.approx(50.0, rel=1e-3) for s in timed)
    assert {s.rate_from for s in timed} == {"timestamps"}


def log_run(
    rates: list[float | None], interval: float, every: int, t_reads: list[float] | None = None
) -> RunBuilder:
    b = RunBuilder()
    b.start(instrumented=False)
    for i, r in enumerate(rates):
        b.now = t_reads[i] if t_reads else b.now + interval
        step = (i + 1) * every
        b.rx(p.Step(step=step, t=b.now, loss=2.0, source="log", rate=r, rate_from="bar rate" if r else None))
    return b


def test_the_pace_is_the_trainers_own_where_it_says_it_with_its_source() -> None:
    # Records read 0.9 s apart (a log poll's pace) while the trainer says 11 steps/s.
    b = log_run([11.0, 10.8, 11.3, 40.0, 11.1], interval=0.9, every=10)
    assert fig.pace(b.run) == (pytest.approx(11.1), "bar rate")
    d = status_dict(b.run, now=b.now)
    assert d["steps_per_s"] == pytest.approx(11.1) and d["steps_per_s_from"] == "bar rate"
    assert "11.1 steps/s (from the log: its progress bar)" in status_lines(d)[1]
    view = views.cadence_view(b.run, b.now)
    assert view.rate_from == "bar rate" and view.interval_s == pytest.approx(1 / 11.1)


def test_without_timing_each_read_time_counts_once() -> None:
    """A block-buffered stdout: 100 records (a step each) arrive at each of five reads 10 s apart.
    The pace is 100 steps per 10 s, not "?" (every record in the last 32 read at one time)."""
    reads = [1_000_100.0 + 10 * (i // 100) for i in range(500)]
    b = log_run([None] * 500, interval=0, every=1, t_reads=reads)
    assert fig.pace(b.run) == (pytest.approx(10.0), "read times")
    assert (
        "10.0 steps/s (from the log: when its lines were read)" in status_lines(status_dict(b.run, b.now))[1]
    )
    # The reporter's steps say so.
    r = RunBuilder()
    r.start()
    r.steps(40, interval=0.25)
    assert fig.pace(r.run) == (pytest.approx(4.0), "reporter")
    # A reporter's step claiming a log's timing is still the reporter's pace.
    r.now += 0.25
    r.rx(p.Step(step=41, t=r.now, rate=99.0, rate_from="bar rate"))
    assert fig.pace(r.run) == (pytest.approx(4.0), "reporter")


def test_a_step_s_rate_survives_the_journal_s_batches() -> None:
    recs = [
        p.Received(
            attempt=1, rank=0, t=100.0 + i, msg=p.Step(step=i, t=100.0 + i, source="log", rate=r, rate_from=f)
        )
        for i, (r, f) in enumerate(
            [(None, None), (8.25, "bar rate"), (0.125, "iteration times"), (3.0, "timestamps")]
        )
    ]
    assert stepbatch.decode(stepbatch.encode(1, recs)) == recs
