"""What "live" means to `runs`, the runs overview and `trainroom` with no run named: a trainer
runs. A keeper that stays after its trainer ended (lingering, or resting for a viewer) keeps a
run reachable, not live."""

from __future__ import annotations

from pathlib import Path

from trainroom.core.probes.procs import pid_alive
from trainroom.core.run import summary as summaries
from trainroom.core.run.store import JOURNAL_NAME, RunInfo
from trainroom.core.run.summary import RunSummary


def runs_trainer(keeper_alive: bool, s: RunSummary | None, fresh: bool, trainer_pid_alive: bool) -> bool:
    """From the keeper's liveness and its one-line summary: a summary that says the attempt ended
    is believed while it is fresh (the journal has not grown since: no new attempt); one that
    says it runs is believed while its pid lives. Without a summary, a live keeper counts."""
    if not keeper_alive:
        return False
    if s is None:
        return True
    if s.attempt_ended:
        return not fresh
    return s.pid is None or trainer_pid_alive


def trainer_runs(info: RunInfo) -> bool:
    """Whether a trainer runs under `info`'s keeper (a remote run: whether its keeper lives)."""
    if not info.alive or info.remote:
        return info.alive
    d = Path(info.run_dir)
    s = summaries.read(d)
    fresh = s is not None and summaries.fresh(s, d / JOURNAL_NAME)
    return runs_trainer(True, s, fresh, s is not None and s.pid is not None and pid_alive(s.pid))
