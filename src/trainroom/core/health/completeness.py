"""CKPT_INCOMPLETE: a verified checkpoint that lacks part of what a faithful resume needs, where
the run shows it should have it: its own first checkpoint held that part, or the trainer reports
an optimizer's LR (its steps carry the param groups' LR) while the checkpoint has no optimizer
state, or a warm-up is declared while the checkpoint has no scheduler. A resume from it would go
on with Adam restarted cold, the LR back at warm-up, the data seen again: the run's own earlier
checkpoints show that is not what the trainer meant to keep.
"""

from __future__ import annotations

import os

from trainroom.core.findings import Finding
from trainroom.core.resumable import RESUME_PARTS, Completeness, part_losses
from trainroom.core.run.parts import CheckpointView
from trainroom.core.run.state import RunState


def _kept(run: RunState) -> list[tuple[CheckpointView, Completeness]]:
    """Verified checkpoints whose completeness was read, oldest first."""
    out = [
        (c, c.report.completeness)
        for c in run.checkpoints
        if c.state == "verified" and c.report is not None and c.report.completeness is not None
    ]
    return sorted(out, key=lambda x: (x[0].step if x[0].step is not None else -1, x[0].t))


def expected_parts(run: RunState, first: CheckpointView, held: Completeness) -> dict[str, str]:
    """The parts each checkpoint of the run should hold, with why."""
    why: dict[str, str] = {
        n: f"its first checkpoint (step {first.step}) held it" for n in RESUME_PARTS if held.holds(n)
    }
    if any(r.lr for r in run.ranks.values()):
        why.setdefault("optimizer", "the trainer reports an optimizer's LR")
    a = run.attempt
    if a is not None and a.requested.warmup_steps:
        why.setdefault("scheduler", f"the run declares {a.requested.warmup_steps} warm-up steps")
    return why


def ckpt_incomplete(run: RunState) -> Finding | None:
    kept = _kept(run)
    if not kept:
        return None
    first, held = kept[0]
    want = expected_parts(run, first, held)
    lacking = [(c, comp, [n for n in want if not comp.holds(n)]) for c, comp in kept]
    lacking = [x for x in lacking if x[2]]
    if not lacking:
        return None
    c, comp, lacks = lacking[-1]  # the newest: the one a resume would reach first
    fp16 = "scaler" in lacks
    lost = [x for n, x in part_losses(comp, step=c.step, fp16=fp16).items() if n in lacks]
    older = f" (and {len(lacking) - 1} other checkpoint(s))" if len(lacking) > 1 else ""
    because = "; ".join(sorted({want[n] for n in lacks}))
    where = f"step {c.step} " if c.step is not None else ""
    return Finding(
        code="CKPT_INCOMPLETE",
        severity="warning",
        key=c.path,
        message=(
            f"checkpoint {where}({os.path.basename(c.path.rstrip('/'))}) lacks the {', '.join(lacks)}"
            f"{older} ({because}): a resume from it is not faithful"
            + (f" — {'; '.join(lost)}" if lost else "")
        ),
        evidence={
            "path": c.path,
            "step": c.step,
            "lacks": lacks,
            "why": {n: want[n] for n in lacks},
            "first_path": first.path,
            "first_step": first.step,
            "incomplete": [x[0].path for x in lacking],
        },
    )
