"""CKPT_INCOMPLETE, the resume plan's lost lines and `status --json` from the run's checkpoint
records: a checkpoint lacking what the run's first held, the optimizer of a trainer that reports
an LR, the scheduler of a declared warm-up. The records are the journal's own, old and new."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tests.support.run_builder import RunBuilder
from trainroom.core.actions.resume import Resume
from trainroom.core.health.completeness import ckpt_incomplete
from trainroom.core.health.rules import ALL
from trainroom.core.ops.resume import ResumePlan, resume_losses
from trainroom.core.resumable import Completeness, Part
from trainroom.core.run.status import status_dict
from trainroom.core.wire import protocol as p

FULL = ("model", "optimizer", "scheduler", "rng", "data", "step")


def _holding(*held: str) -> Completeness:
    return Completeness(
        parts={n: Part(present=n in held, seen=f"{n} seen" if n in held else "") for n in (*FULL, "config")}
    )


def _verified(b: RunBuilder, step: int, c: Completeness | None, promoted: str | None = None) -> str:
    path = f"/ck/.quarantine/step-{step:06d}.pt"
    b.now += 1
    report = p.CheckpointReport(ok=True, promoted_file=promoted, completeness=c)
    b.apply(p.CheckpointState(path=path, step=step, state="verified", t=b.now, report=report))
    return path


def test_a_checkpoint_lacking_what_the_first_held_raises_it_naming_what_a_resume_loses() -> None:
    b = RunBuilder()
    b.start()
    _verified(b, 100, _holding(*FULL))
    assert ckpt_incomplete(b.run) is None
    _verified(b, 200, _holding(*FULL))
    assert ckpt_incomplete(b.run) is None
    newest = _verified(b, 300, _holding("model", "step", "data"))
    f = ckpt_incomplete(b.run)
    assert f is not None and f.code == "CKPT_INCOMPLETE" and f.severity == "warning" and f.key == newest
    assert f.evidence["lacks"] == ["optimizer", "scheduler", "rng"]
    assert f.evidence["first_step"] == 100 and f.evidence["incomplete"] == [newest]
    assert f.message.startswith("checkpoint step 300 (step-000300.pt) lacks the optimizer, scheduler, rng")
    assert "its first checkpoint (step 100) held it" in f.message
    assert "Adam restarts cold" in f.message and "the LR restarts at warm-up" in f.message
    # The finding is one of the watchdog's listed rules.
    assert "watchdog.ckpt_incomplete" in ALL


def test_a_run_whose_trainer_reports_an_lr_needs_the_optimizer_from_the_first_checkpoint() -> None:
    b = RunBuilder()
    b.start()
    _verified(b, 10, _holding("model", "step"))
    assert ckpt_incomplete(b.run) is None  # nothing says this run has an optimizer to keep
    b.rx(p.Step(step=11, t=b.now, loss=2.0, lr=[3e-4]))
    f = ckpt_incomplete(b.run)
    assert f is not None and f.evidence["lacks"] == ["optimizer"]
    assert f.evidence["why"] == {"optimizer": "the trainer reports an optimizer's LR"}
    # A declared warm-up wants the scheduler too.
    b.rx(p.Hello(pid=b.pid, config=p.RequestedConfig(warmup_steps=100)))
    f = ckpt_incomplete(b.run)
    assert f is not None and f.evidence["lacks"] == ["optimizer", "scheduler"]


def test_checkpoints_without_completeness_an_older_journal_raise_nothing() -> None:
    b = RunBuilder()
    b.start()
    b.rx(p.Step(step=1, t=b.now, loss=2.0, lr=[3e-4]))
    _verified(b, 10, None)
    b.verified(20)
    assert ckpt_incomplete(b.run) is None
    # A journal record written before completeness was read decodes, and one with it round-trips.
    old = msgspec.msgpack.encode(p.CheckpointReport(ok=True))
    assert msgspec.msgpack.decode(old, type=p.CheckpointReport).completeness is None
    new = p.CheckpointReport(ok=True, completeness=_holding("model"))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=p.CheckpointReport) == new


def test_the_resume_plan_names_what_its_checkpoint_loses(tmp_path: Path) -> None:
    b = RunBuilder()
    b.start()
    promoted = str(tmp_path / "step-000300" / "ckpt.pt")
    _verified(b, 300, _holding("model", "step", "scheduler"), promoted=promoted)
    plan = ResumePlan(attempt=2, checkpoint=promoted, step=300)
    lost = resume_losses(b.run, plan)
    assert lost == [
        "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)",
        "data position absent: batches 0–300 seen again",
        "RNG absent: a different data order and dropout from here on",
    ]
    # An fp16 run (it reports a loss scale) loses its scaler too.
    b.rx(p.Step(step=301, t=b.now, loss=2.0, loss_scale=65536.0))
    assert "loss scaler absent: the fp16 loss scale restarts at its initial value" in resume_losses(
        b.run, plan
    )
    # The plan's lines say the losses first, a line each.
    plan.lost = lost
    lines = Resume().plan_lines(plan)
    assert lines[:3] == [f"  lost: {x}" for x in lost]
    assert not any(line.startswith("  lost:") for line in lines[3:])


def test_status_json_shows_each_checkpoints_completeness() -> None:
    b = RunBuilder()
    b.start()
    _verified(b, 10, _holding(*FULL))
    _verified(b, 20, None)
    rows = status_dict(b.run, now=b.now)["checkpoints"]
    assert rows[1]["completeness"] is None
    c = rows[0]["completeness"]
    assert c["holds"] == list(FULL) and c["lacks"] == ["config"]
    assert c["marks"] == "model opt sched rng data"
    assert c["parts"]["optimizer"] == {"present": True, "seen": "optimizer seen"}
    assert c["parts"]["config"] == {"present": False, "seen": None}
