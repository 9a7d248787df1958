"""The checkpoint table marks what each checkpoint holds of a faithful resume: the parts it holds,
a missing one as `-opt`; a checkpoint verified before completeness was read shows no marks."""

from __future__ import annotations

import msgspec

from tests.support.tui_fakes import build_state, dead_run_records, in_loop, make_app, screen_text, settle
from trainroom.core.resumable import Completeness, Part
from trainroom.core.wire import protocol as p
from trainroom.tui import figures


def _records() -> list:
    """The dead run, its verified step 300 holding no optimizer state (a weights-only save)."""
    held = ("model", "scheduler", "rng", "data", "step")
    c = Completeness(
        parts={n: Part(present=n in held) for n in ("model", "optimizer", "scheduler", "rng", "data", "step")}
    )
    out = []
    for r in dead_run_records():
        if isinstance(r, p.CheckpointState) and r.step == 300:
            r = msgspec.structs.replace(r, report=p.CheckpointReport(ok=True, completeness=c))
        out.append(r)
    return out


def test_the_disk_view_carries_each_rows_marks() -> None:
    disk = figures.disk_view(build_state(_records()))
    rows = {c.step: c.parts for c in disk.checkpoints}
    assert rows == {300: "model -opt sched rng data", 322: ""}


@in_loop
async def test_the_checkpoint_table_shows_the_missing_optimizer(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), _records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
    row = next(line for line in text.splitlines() if "step 300" in line and "verified" in line)
    # The panel is narrower than the whole column: what the checkpoint lacks stays.
    assert row.rstrip(" │").endswith("← latest -opt"), row


def test_the_resume_confirmation_names_what_is_lost_right_after_the_checkpoint() -> None:
    from trainroom.tui.evidence import plan_lines

    plan = {
        "ok": True,
        "attempt": 2,
        "argv": ["python", "train.py"],
        "checkpoint": "/ck/step-000300/ckpt.pt",
        "step": 300,
        "mem_available_bytes": 1 << 30,
        "lost": [
            "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)",
            "RNG absent: a different data order and dropout from here on",
        ],
    }
    lines = plan_lines(plan)
    at = next(i for i, line in enumerate(lines) if line.startswith("lost"))
    assert lines[at - 1].startswith("step") and lines[at + 1].strip().startswith("optimizer moments reset")
    assert lines[at + 2].strip().startswith("RNG absent")
