"""The demo run the control room's end-to-end tests share: scenario 1 (silent death) with a
checkpoint every few steps, and the wait until it is DEAD with its last checkpoint verified."""

from __future__ import annotations

from typing import Any

from tests.support.helpers import start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs

START_S = 120.0  # torch's import on a loaded 2-core machine, then a few steps
FAULT_STEP = 25
CKPT_EVERY = 10
LAST_CKPT = 20  # the last checkpoint before the fault step


def dead_with_checkpoint(info: runs.RunInfo) -> dict[str, Any]:
    """DEAD at the fault step, once the last checkpoint before it has verified (so the resume
    plan's checkpoint is the one the test expects)."""

    def ready() -> dict[str, Any] | None:
        s = status(info)
        dead = next((f for f in s["findings"] if f["code"] == "DEAD"), None)
        ckpt = next(
            (c for c in s["checkpoints"] if c["state"] == "verified" and c["step"] == LAST_CKPT), None
        )
        # `latest` is read by the disk probe, a second behind the verification at most.
        if (
            s["state"] == "dead"
            and dead
            and dead["evidence"].get("last_verified_step") == LAST_CKPT
            and ckpt
            and s["latest_checkpoint"]
            and s["latest_checkpoint"] == ckpt["promoted"]
        ):
            return s
        return None

    return wait_for(ready, timeout=START_S, what=f"DEAD at step {FAULT_STEP} with step {LAST_CKPT} verified")


def start_silent_death(**kw: Any) -> runs.RunInfo:
    return start_demo(
        fault="silent-death", fault_step=FAULT_STEP, ckpt_every=CKPT_EVERY, step_delay=0.02, **kw
    )
