"""Before a Slurm job's time limit: when the time left falls below the run's checkpoint time plus a
margin, checkpoint, verify and requeue, as the job's warning signal (`--signal=B:USR2@N`) does. A
job submitted without `--signal`, or with one too late for this run's checkpoints, is still
requeued from a verified checkpoint before Slurm ends it.

The pure parts, each a function of plain figures (the keeper's side is core/keeper/timeleft.py):

- the time left: `SLURM_JOB_END_TIME` (Unix seconds; Slurm 23.02 and later set it in every task's
  environment), else what `scontrol show job` said (TimeLimit - RunTime, as of the query), counted
  down on the keeper's clock between two queries;
- the checkpoint time: the longest of the run's last few verified checkpoints, each from the start
  of its save (the trainer's `checkpoint-save` phase) to its verdict (the keeper's verification),
  since a requeue waits for both; the setting's default until one is measured;
- the decision, in words: "time left 2m10s < checkpoint time 40 s + margin 1m00s".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trainroom.core.units import fmt_duration

END_TIME_ENV = "SLURM_JOB_END_TIME"
# How many of the newest measured checkpoints the checkpoint time is the longest of.
KEEP_MEASURED = 3


def left_from_env(env: Mapping[str, str], now: float) -> float | None:
    """The time left by SLURM_JOB_END_TIME (None when unset, 0, or not a number)."""
    text = env.get(END_TIME_ENV, "").strip()
    if not text.isdigit() or int(text) <= 0:
        return None
    return max(0.0, int(text) - now)


def left_counted_down(left_at_query: float | None, queried_at: float, now: float) -> float | None:
    """The time left `now`, from what slurmctld said at `queried_at` (same clock)."""
    if left_at_query is None or not math.isfinite(left_at_query):
        return None
    return max(0.0, left_at_query - max(0.0, now - queried_at))


def save_seconds(started_at: float | None, verified_at: float, verify_s: float, poll_s: float) -> float:
    """How long one checkpoint took, from the start of its save to its verdict. A save shorter than
    the keeper's look at the trainer's phase (`started_at` None, or after the verdict) counts as
    its verification plus that look's interval: an upper bound of what was missed."""
    if started_at is None or started_at > verified_at:
        return max(0.0, verify_s) + poll_s
    return verified_at - started_at


def checkpoint_time_s(measured: Sequence[float], keep: int = KEEP_MEASURED) -> float | None:
    """The run's checkpoint time: the longest of its last `keep` measured checkpoints (oldest
    first in `measured`); None when none was measured yet."""
    last = [s for s in measured[-keep:] if math.isfinite(s) and s >= 0]
    return max(last) if last else None


def decide(left_s: float | None, measured_s: float | None, default_s: float, margin_s: float) -> str | None:
    """Why to checkpoint and requeue now, in words, or None: the time left is unknown (no limit),
    or not below the checkpoint time plus the margin."""
    if left_s is None or not math.isfinite(left_s):
        return None
    measured = measured_s is not None and math.isfinite(measured_s)
    ckpt = measured_s if measured_s is not None and measured else default_s
    if left_s >= ckpt + margin_s:
        return None
    how = "" if measured else " (the default: no verified checkpoint of this run measured yet)"
    return (
        f"time left {fmt_duration(left_s)} < checkpoint time {fmt_duration(ckpt)}{how} "
        f"+ margin {fmt_duration(margin_s)}"
    )
