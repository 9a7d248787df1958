"""The bounded plot series: min/max buckets against tokens, marks, snapshots."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from trainroom.core.run.series import Series, SeriesSnapshot

TOKENS_PER_STEP = 4096


def feed(
    s: Series,
    steps: range,
    seed: int = 0,
    lr: float = 1e-4,
    spike_at: int | None = None,
    tokens_offset: int = 0,
) -> list[float]:
    rng = random.Random(seed)
    losses = []
    for i in steps:
        loss = 2.0 + 8.0 * math.exp(-i / 3000) + rng.gauss(0, 0.05)
        if i == spike_at:
            loss = 50.0
        losses.append(loss)
        s.observe_step(
            i,
            t=i * 0.01,
            tokens=i * TOKENS_PER_STEP + tokens_offset,
            loss=loss,
            lr=[lr],
            grad_norm=1.0 + rng.random(),
        )
    return losses


def values(col_lo: list[float | None]) -> list[float]:
    return [v for v in col_lo if v is not None]


def test_a_day_long_run_stays_bounded_and_keeps_every_extreme() -> None:
    s = Series(max_buckets=2000)
    losses = feed(s, range(100_000), spike_at=61_234)
    snap = s.snapshot()
    assert 1000 <= len(snap.index) <= 2000 and s.used <= 2000
    assert snap.total_points == 100_000 and sum(snap.points) == 100_000
    assert max(values(snap.loss.hi)) == 50.0  # one step's spike survives every merge
    assert min(values(snap.loss.lo)) == min(losses)
    n = snap.loss.n
    mean = sum(m * k for m, k in zip(values(snap.loss.mean), n, strict=True)) / sum(n)
    assert mean == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    # Against tokens: the axis spans the tokens seen, buckets are uniform and ordered.
    assert snap.x_unit == "tokens" and snap.x_lo[0] == 0.0 and snap.x_hi[-1] == 99_999 * TOKENS_PER_STEP
    assert snap.index == sorted(snap.index)
    assert all(lo <= hi for lo, hi in zip(snap.x_lo, snap.x_hi, strict=True))
    assert len(msgspec.msgpack.encode(snap)) < 400_000


def test_small_runs_keep_one_point_per_bucket() -> None:
    s = Series(max_buckets=2000)
    feed(s, range(500))
    snap = s.snapshot()
    assert len(snap.index) == 500 and snap.points == [1] * 500 and snap.width == TOKENS_PER_STEP
    assert snap.centres()[:3] == [0.0, 4096.0, 8192.0]


def test_steps_axis_without_tokens_and_step_time_from_t() -> None:
    s = Series()
    for i in range(10):
        s.observe_step(i, t=100.0 + 0.5 * i, loss=3.0)
    snap = s.snapshot()
    assert snap.x_unit == "steps" and snap.x_lo == [float(i) for i in range(10)]
    assert snap.step_time.n == [0] + [1] * 9 and values(snap.step_time.mean) == [pytest.approx(0.5)] * 9


def test_nonfinite_values_are_counted_not_plotted() -> None:
    s = Series()
    s.observe_step(0, tokens=0, loss=2.0)
    s.observe_step(1, tokens=10, loss=math.nan, grad_norm=math.inf)
    snap = s.snapshot()
    assert snap.loss.nonfinite == [0, 1] and snap.grad_norm.nonfinite == [0, 1]
    assert snap.loss.lo == [2.0, None]


def test_restart_replay_lands_in_past_buckets_and_the_mark_sits_where_the_attempt_starts() -> None:
    s = Series()
    feed(s, range(322))
    s.mark("checkpoint", label="step-000300", step=300)
    s.mark("restart", label="attempt 2", step=300)
    # Attempt 2 resumes from step 300: tokens go back, 22 steps are seen again.
    t0 = 10_000.0
    for i in range(300, 340):
        s.observe_step(i, t=t0 + i * 0.01, tokens=i * TOKENS_PER_STEP, loss=2.5)
    snap = s.snapshot()
    kinds = {m.kind: m for m in snap.marks}
    assert kinds["checkpoint"].x == 321 * TOKENS_PER_STEP  # the latest point when it was marked
    assert kinds["restart"].x == 300 * TOKENS_PER_STEP and kinds["restart"].label == "attempt 2"
    # The replayed buckets hold both attempts; the gap across the restart is not a step time.
    k = snap.index.index(310)
    assert snap.points[k] == 2 and snap.loss.lo[k] == 2.5 and (snap.loss.hi[k] or 0) > 9.0
    assert max(values(snap.step_time.hi)) < 1.0


def test_lr_change_marks_jumps_not_warmup_or_cosine() -> None:
    s = Series()
    lr_max, n = 1e-3, 400
    for i in range(n):
        if i < 50:
            lr = lr_max * (i + 1) / 50
        elif i < 300:
            lr = lr_max * 0.5 * (1 + math.cos(math.pi * (i - 50) / 250))
        elif i < 350:
            lr = 1e-4  # flat, then a StepLR-like drop
        else:
            lr = 1e-5
        s.observe_step(i, tokens=i * 100, loss=2.0, lr=lr)
    marks = s.snapshot().marks
    assert [(m.kind, m.step) for m in marks] == [("lr-change", 350)]
    assert marks[0].label == "lr 0.0001 -> 1e-05"


def test_loss_scale_halvings_are_marked_and_fold_per_bucket() -> None:
    s = Series(max_buckets=8, max_marks=500)
    scale = 65536.0
    for i in range(8):
        s.observe_step(i, tokens=i * 10, loss=2.0, loss_scale=scale)
    for i in range(8, 16):  # every step overflows: 8 halvings
        scale /= 2
        s.observe_step(i, tokens=i * 10, loss=2.0, loss_scale=scale * 1.0)
    marks = [m for m in s.snapshot().marks if m.kind == "loss-scale"]
    assert sum(m.count for m in marks) == 8
    assert len(marks) < 8  # the merges folded marks that now share a bucket
    assert marks[0].label == "loss scale 65536 -> 32768"
    # Growth is not marked.
    g = Series()
    g.observe_step(0, tokens=0, loss_scale=1024.0)
    g.observe_step(1, tokens=1, loss_scale=2048.0)
    assert g.snapshot().marks == []


def test_marks_are_bounded() -> None:
    s = Series(max_buckets=2000, max_marks=50)
    for i in range(1000):
        s.observe_step(i, tokens=i, loss=2.0)
        s.mark("checkpoint", label=f"step-{i:06d}", step=i)
    marks = s.snapshot().marks
    assert len(marks) <= 50 and sum(m.count for m in marks) == 1000
    assert marks[0].label == "step-000000"


def test_snapshot_roundtrip_and_a_client_keeps_folding() -> None:
    whole, half = Series(max_buckets=64), Series(max_buckets=64)
    feed(whole, range(3000), seed=1)
    feed(half, range(1500), seed=1)
    whole.set_loss_baseline(50257)
    half.set_loss_baseline(50257)
    half.mark("restart", label="attempt 2")
    whole.mark("restart", label="attempt 2")
    wire = msgspec.msgpack.encode(half.snapshot())
    client = Series.from_snapshot(msgspec.msgpack.decode(wire, type=SeriesSnapshot))
    rng = random.Random(1)
    for _ in range(1500):  # the same random stream as the first half consumed, then on
        rng.gauss(0, 0.05), rng.random()
    for i in range(1500, 3000):
        loss = 2.0 + 8.0 * math.exp(-i / 3000) + rng.gauss(0, 0.05)
        client.observe_step(
            i, t=i * 0.01, tokens=i * TOKENS_PER_STEP, loss=loss, lr=[1e-4], grad_norm=1.0 + rng.random()
        )
    a, b = whole.snapshot(), client.snapshot()
    assert a.loss_baseline == pytest.approx(math.log(50257)) == b.loss_baseline
    assert (a.index, a.points, a.x_lo, a.x_hi, a.width) == (b.index, b.points, b.x_lo, b.x_hi, b.width)
    assert a.loss.lo == b.loss.lo and a.loss.hi == b.loss.hi
    assert values(a.loss.mean) == pytest.approx(values(b.loss.mean), rel=1e-12)
    assert [(m.kind, m.x) for m in a.marks] == [(m.kind, m.x) for m in b.marks]
    assert isinstance(whole.to_builtins()["loss"], dict)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        Series(max_buckets=3)


def test_folds_the_keepers_records() -> None:
    from trainroom.core.wire import protocol as p

    s = Series()
    recs = [
        p.AttemptStarted(n=1, t=0.0, pid=1, pgid=1, start_time=0.0, argv=[], cwd="/"),
        p.Received(attempt=1, rank=0, t=0.0, msg=p.Hello(pid=1, config=p.RequestedConfig(vocab_size=50257))),
        p.Received(attempt=1, rank=0, t=1.0, msg=p.Step(step=1, t=1.0, tokens=100, loss=10.0, lr=[1e-6])),
        p.Received(attempt=1, rank=1, t=1.0, msg=p.Step(step=1, t=1.0, tokens=100, loss=99.0)),  # not rank 0
        p.CheckpointState(path="/ck/step-000001/", step=1, state="verified", t=1.5),
        p.CheckpointState(path="/ck/step-000002/", step=2, state="rejected", t=1.6),
        p.AttemptStarted(n=2, t=2.0, pid=2, pgid=2, start_time=2.0, argv=[], cwd="/"),
        p.Received(
            attempt=2, rank=0, t=2.5, msg=p.Note(kind="lr-reimposed", t=2.5, message="1e-06 -> 0.0001")
        ),
        p.Received(attempt=2, rank=0, t=3.0, msg=p.Step(step=2, t=3.0, tokens=200, loss=9.0, lr=[1e-4])),
    ]
    for r in recs:
        s.observe_record(r)
    snap = s.snapshot()
    assert snap.loss_baseline == pytest.approx(math.log(50257))
    assert values(snap.loss.hi) == [10.0, 9.0] and snap.total_points == 2
    assert [(m.kind, m.x, m.label) for m in snap.marks] == [
        ("checkpoint", 100.0, "step-000001"),
        ("lr-change", 100.0, "1e-06 -> 0.0001"),
        ("restart", 200.0, "attempt 2"),
    ]
