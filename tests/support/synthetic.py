"""A synthetic run's records, in the order a keeper emits them, and a run dir written from them
through the real JournalWriter (no keeper process): for the journal, snapshot and retention tests."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import msgspec

from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.findings import Finding
from trainroom.core.journal.writer import JournalWriter
from trainroom.core.run import store
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p

T0 = 1_780_000_000.0


def f32(x: float) -> float:
    """What `loss.item()` of a float32 tensor gives: a double with a float32's mantissa."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def run_records(
    steps: int, ranks: int = 2, *, attempts: int = 2, seed: int = 7, t0: float = T0
) -> Iterator[p.Record]:
    """Attempts of a run: hellos, steps on every rank (a NaN, a gap in tokens, an LR change),
    heartbeats, an eval phase, checkpoints, findings raised and cleared, status changes, notes."""
    rnd = random.Random(seed)
    t = t0
    yield p.KeeperStarted(t=t, pid=100)
    step = 0
    for n in range(1, attempts + 1):
        pid = 1000 + n
        resume = f"/ck/step-{step:06d}" if n > 1 else None
        yield p.AttemptStarted(
            n=n,
            t=t,
            pid=pid,
            pgid=pid,
            start_time=t,
            argv=["python", "train.py"],
            cwd="/w",
            resume_from=resume,
        )
        yield p.RunStatus(t=t, state="starting")
        for r in range(ranks):
            hello = p.Hello(
                pid=pid + r, rank=r, world_size=ranks, config=p.RequestedConfig(lr=3e-4, vocab_size=50257)
            )
            yield p.Received(attempt=n, rank=r, t=t, msg=hello)
        yield p.RunStatus(t=t, state="running")
        lr = 3e-4
        for _ in range(steps // attempts):
            step += 1
            t += 0.1 + rnd.random() * 0.01
            if step % 500 == 0:
                lr /= 3
            for r in range(ranks):
                loss = (
                    float("nan")
                    if step == 77 and r == 1
                    else f32(10 * math.exp(-step / 300) + 2 + rnd.gauss(0, 0.05))
                )
                msg = p.Step(
                    step=step,
                    t=t - 1e-4,
                    tokens=None if step % 97 == 0 else step * 4096,
                    loss=loss,
                    grad_norm=f32(abs(rnd.gauss(1, 0.3))),
                    lr=[lr, lr / 10],
                    alloc_allocated=2 << 30,
                    alloc_reserved=3 << 30,
                    alloc_peak=(3 << 30) + step % 7,
                )
                yield p.Received(attempt=n, rank=r, t=t + r * 1e-5, msg=msg)
            if step % 10 == 0:
                for r in range(ranks):
                    beat = p.Heartbeat(t=t, main_frame="train.py:88 in train_step", main_frame_age_s=0.01)
                    yield p.Received(attempt=n, rank=r, t=t + 2e-5, msg=beat)
            if step % 150 == 0:
                yield p.Received(attempt=n, rank=0, t=t, msg=p.Phase(name="eval", t=t, bound_s=30.0))
                yield p.Received(attempt=n, rank=0, t=t, msg=p.Heartbeat(t=t, phase="eval"))
            if step % 200 == 0:
                path = f"/ck/step-{step:06d}"
                yield p.Received(
                    attempt=n, rank=0, t=t, msg=p.Checkpoint(path=path, step=step, t=t, size_bytes=1 << 20)
                )
                yield p.CheckpointState(path=path, step=step, state="verifying", t=t)
                yield p.CheckpointState(path=path, step=step, state="verified", t=t + 0.05)
            if step % 333 == 0:
                f = Finding(
                    code="LOSS_SPIKE",
                    severity="warning",
                    message=f"spike at {step}",
                    first_seen=t,
                    last_seen=t,
                )
                yield p.FindingRaised(finding=f)
            if step % 333 == 100:
                yield p.FindingCleared(ident="LOSS_SPIKE", t=t)
            if step % 420 == 0:
                note = p.Note(
                    kind="lr-reimposed", t=t, message="lr re-imposed", step=step, data={"changes": True}
                )
                yield p.Received(attempt=n, rank=0, t=t, msg=note)
                yield p.KeeperNote(t=t, message=f"note {step}")
        for r in range(ranks):
            yield p.TrainerDisconnected(attempt=n, rank=r, t=t)
        yield p.ConnectionClosed(t=t, peer_pid=pid, reason="eof")
        yield p.AttemptEnded(
            n=n, t=t + 0.5, exit_code=None if n < attempts else 0, exit_signal=9 if n < attempts else None
        )
        yield p.RunStatus(t=t + 0.5, state="dead" if n < attempts else "exited")


def make_run_dir(home: Path, run_id: str = "20260101-000000-train-abcd") -> tuple[Path, store.RunRecord]:
    d = home / "runs" / run_id
    d.mkdir(parents=True)
    rec = store.RunRecord(run_id=run_id, argv=["python", "train.py"], cwd="/w", created=T0)
    store.write_record(d, rec)
    return d, rec


def write_run(
    run_dir: Path,
    rec: store.RunRecord,
    records: Iterator[p.Record] | list[p.Record],
    policy: JournalPolicy | None = None,
    *,
    flush_every: int = 50,
    close: bool = True,
) -> tuple[RunView, JournalWriter]:
    """Feed the records to a JournalWriter as a keeper would (a flush every few records, as its
    tick does); the view folded in emit order (the keeper's live view) and the writer."""
    live = store.empty_view(rec)
    w = JournalWriter(run_dir, store.fold_of(rec), policy or JournalPolicy())
    for i, r in enumerate(records):
        live.apply(r)
        w.append(r)
        if i % flush_every == 0:
            w.flush()
    if close:
        w.close()
    return live, w


def view_bytes(view: RunView) -> tuple[bytes, bytes]:
    """A view as bytes (state, series internals): equal bytes, equal views (NaN included)."""
    return msgspec.msgpack.encode(view.state), msgspec.msgpack.encode(view.series.state())
