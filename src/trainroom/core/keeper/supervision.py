"""What the keeper runs around its trainer: the probe sweep, the watchdog, the sanity tracker, the
plot series, the checkpoint pipeline and the disk guard. Each rule lives in its own module; this
one only feeds them what they observe and hands their verdicts back to the keeper.

Thread model: `observe`, `evaluate`, `start_attempt` and `attempt_ended` run on the keeper's loop
thread; `probe` runs in a worker thread once a second (NVML and /proc reads block) on targets read
on the loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainroom.core import protocol as p
from trainroom.core.findings import Finding
from trainroom.core.health.sanity import SanityTracker
from trainroom.core.health.watchdog import Watchdog, context_from_probe, crash_from_log
from trainroom.core.probes.sweep import ProbeSweep, ProbeTargets
from trainroom.core.run.series import Series
from trainroom.core.run.state import RunState

if TYPE_CHECKING:
    from trainroom.core.keeper.loop import Keeper


def targets_of(run: RunState) -> ProbeTargets:
    """What one probe cycle looks at, read from the run on the keeper's loop thread."""
    a = run.attempt
    if a is None:
        return ProbeTargets()
    return ProbeTargets(
        attempt=a.n,
        pid=a.pid,
        pgid=a.pgid,
        alive=a.alive,
        argv=list(a.argv),
        cwd=a.cwd,
        rank_pids=sorted({r.pid for r in list(run.ranks.values()) if r.pid}),
    )


class Supervision:
    def __init__(self, keeper: Keeper) -> None:
        cfg = keeper.config
        self.keeper = keeper
        self.thresholds = cfg.thresholds
        self.sweep = ProbeSweep(lock_paths=keeper.lock_files(), host_process_names=cfg.host_processes)
        self.watchdog = Watchdog()
        self.sanity = SanityTracker(cfg.thresholds)
        self.series = Series()
        self._targets = ProbeTargets()
        self._series_pushed = 0.0
        self.checkpoints = _checkpoint_pipeline(keeper)

    # ------------------------------------------------------------------ records

    def observe(self, rec: Any) -> None:
        self.sanity.observe_record(rec)
        self.series.observe_record(rec)
        if self.checkpoints is not None:
            self.checkpoints.observe(rec)

    def start_attempt(self, keeper: Keeper, started: p.AttemptStarted) -> None:
        self._targets = targets_of(keeper.state)

    async def attempt_ended(self, keeper: Keeper, ended: p.AttemptEnded) -> None:
        self._targets = targets_of(keeper.state)
        if keeper.auto_resume is not None:
            await keeper.auto_resume.attempt_ended(ended)

    def crash_from_log(self, text: str) -> p.Crash | None:
        return crash_from_log(text)

    # ------------------------------------------------------------------ probes (worker thread)

    def targets(self) -> ProbeTargets:
        """Read on the loop thread, handed to `probe` in the worker."""
        self._targets = targets_of(self.keeper.state)
        return self._targets

    def probe(self, targets: ProbeTargets) -> p.ProbeSample:
        sample = self.sweep.sample(targets)
        if self.checkpoints is not None:
            sample.disk = self.checkpoints.disk_sample()
        return sample

    def gpu_probe(self) -> Any:
        return self.sweep.gpu

    # ------------------------------------------------------------------ verdicts (loop thread)

    def evaluate(self, keeper: Keeper, now: float) -> tuple[str, str, list[Finding]]:
        st = keeper.state
        a = st.attempt
        ctx = context_from_probe(
            st.probe,
            thresholds=self.thresholds,
            alive=keeper.proc is not None and keeper.proc.returncode is None,
            attempt=a.n if a else None,
        )
        verdict = self.watchdog.evaluate(st, ctx, now)
        found = list(verdict.findings)
        found += self.sanity.findings(now)
        if self.checkpoints is not None:
            found += self.checkpoints.findings(now)
        if now - self._series_pushed >= 1.0:
            # O(buckets): refreshed once a second for the snapshot, never per step.
            st.series = self.series.to_builtins()
            self._series_pushed = now
        return verdict.state, verdict.reason, found


def _checkpoint_pipeline(keeper: Keeper) -> Any:
    try:
        from trainroom.core.keeper.pipeline import CheckpointPipeline
    except ImportError:
        return None
    return CheckpointPipeline(keeper)
