"""What the keeper runs around its trainer: the probe sweep, the watchdog and the sanity tracker.
Each rule lives in `health/`; this module only feeds them what they observe and hands their
verdicts back to the keeper.

Thread model: `observe` and `evaluate` run on the keeper's loop thread; `probe` runs in a worker
thread once a second (NVML and /proc reads block) on targets read on the loop thread.
"""

from __future__ import annotations

from trainroom.core.configuration.settings import RunSettings
from trainroom.core.findings import Finding
from trainroom.core.health.guard import FaultSink, Guard
from trainroom.core.health.progress import Judgement
from trainroom.core.health.rules import KEEPER, KeeperFacts, judge
from trainroom.core.health.sanity import SanityTracker
from trainroom.core.health.watchdog import Watchdog, context_from_probe, crash_from_log
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.keeper.workers import WorkerWatch
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.probes.gpuevents import GpuEventWatch
from trainroom.core.probes.sweep import ProbeSweep, ProbeTargets
from trainroom.core.run.state import RunState
from trainroom.core.run.vitals import VitalsClock
from trainroom.core.wire import protocol as p


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
        run_id=run.run_id,
        run_created=run.created,
    )


class Supervision:
    """The probe sweep (worker thread), the watchdog and the sanity tracker (loop thread)."""

    def __init__(
        self,
        settings: RunSettings,
        run: RunContext,
        recorder: Recorder | None = None,
        on_fault: FaultSink | None = None,
    ) -> None:
        self.run = run
        self._recorder = recorder
        # The rank processes (torchrun workers) and how each ended: journaled through `recorder`.
        self.workers = WorkerWatch(recorder, run) if recorder is not None else None
        self.thresholds = settings.thresholds
        self.sweep = ProbeSweep(
            lock_paths=settings.lock_files,
            host_process_names=settings.host_processes,
        )
        # Xids from the kernel log and NVML's events: started by the first probe cycle.
        self.sweep.gpu_events = GpuEventWatch(self.sweep.gpu.nvml)
        self._kernel_log_said = False
        # One guard for every rule, observer, probe and the log reader: what raises is an
        # INTERNAL_ERROR finding (`findings`), the rest goes on.
        self.guard = Guard(on_fault)
        self.watchdog = Watchdog(self.guard)
        self.sanity = SanityTracker(settings.thresholds, self.guard)
        self._probe_faults_t: float | None = None
        self.vitals = VitalsClock()  # the history graphs' samples, journaled every few seconds

    @property
    def gpu(self) -> GpuProbe:
        return self.sweep.gpu

    def observe(self, rec: p.Record) -> None:
        self.guard.call("sanity.observe", lambda: self.sanity.observe_record(rec), None)

    def crash_from_log(self, text: str) -> p.Crash | None:
        return crash_from_log(text)

    # ------------------------------------------------------------------ probes (worker thread)

    def targets(self) -> ProbeTargets:
        """Read on the loop thread, handed to `probe` in the worker."""
        return targets_of(self.run.state)

    def probe(self, targets: ProbeTargets) -> p.ProbeSample:
        return self.sweep.sample(targets)

    # ------------------------------------------------------------------ verdicts (loop thread)

    def evaluate(self, now: float) -> Judgement:
        if self.workers is not None:
            self.workers.sync()
        st = self.run.state
        a = st.attempt
        self._probe_faults(st.probe)
        self._say_kernel_log(st.probe)
        self.guard.call("vitals.journal", self._journal_vitals, None)
        ctx = context_from_probe(
            st.probe,
            thresholds=self.thresholds,
            alive=self.run.trainer_alive(),
            attempt=a.n if a else None,
        )
        verdict = self.watchdog.evaluate(st, ctx, now)
        self._say_pauses()
        return verdict.state, verdict.reason, [*verdict.findings, *self.sanity.findings(now)]

    def _journal_vitals(self) -> None:
        v = self.vitals.due(self.run.state)
        if v is not None and self._recorder is not None:
            self._recorder.emit(p.Vitals(v=v))

    def _say_pauses(self) -> None:
        """The keeper's own stalls, said once each: why nothing was judged for that while."""
        pauses, self.watchdog.pauses = self.watchdog.pauses, []
        for pause in pauses:
            if self._recorder is not None:
                self._recorder.note(
                    f"the keeper itself did not run for {pause.gap_s:.1f} s (stopped, swapped out or "
                    "blocked): the trainer is judged again once what it sent meanwhile is read",
                    "warning",
                )

    def _say_kernel_log(self, sample: p.ProbeSample | None) -> None:
        """Where the GPU's Xids are read from (or why they cannot be), said once."""
        gpu = sample.gpu if sample is not None else None
        if self._kernel_log_said or gpu is None or not gpu.kernel_log or self._recorder is None:
            return
        self._kernel_log_said = True
        bad = gpu.kernel_log.startswith("unavailable")
        self._recorder.note(f"GPU Xids: kernel log {gpu.kernel_log}", "warning" if bad else "info")

    def _probe_faults(self, sample: p.ProbeSample | None) -> None:
        """A probe that raised in the worker thread is a fault like a rule's (once per sample)."""
        if sample is None or sample.t == self._probe_faults_t:
            return
        self._probe_faults_t = sample.t
        for name, text in sample.faults.items():
            line, _, rest = text.partition("\n")
            self.guard.record(name, line, rest)

    def keeper_findings(self, facts: KeeperFacts, now: float) -> list[Finding]:
        """The keeper's own rules (`rules.KEEPER`) over what it knows of itself."""
        return judge(self.guard, KEEPER, facts, now)

    def findings(self, now: float) -> list[Finding]:
        """INTERNAL_ERROR findings: the parts that raised lately."""
        return self.guard.findings(now)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
        self.sweep.close()
