"""One probe cycle: every probe the watchdog reads, gathered into a protocol.ProbeSample.

The keeper takes `targets_of(run)` (keeper.supervision) on its event loop (a consistent read of the run), hands
it to `ProbeSweep.sample` in a worker thread once a second (NVML and /proc reads block), emits
the sample (not journaled), and builds the watchdog's context from `run.probe` with
`watchdog.context_from_probe`. So the TUI and `status` see exactly what the rules saw.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable

import msgspec

from trainroom.core import failpoints
from trainroom.core.probes.gpu import GpuProbe, Nvml
from trainroom.core.probes.gpuevents import GpuEventWatch
from trainroom.core.probes.host import HostProbe
from trainroom.core.probes.leftovers import run_leftovers
from trainroom.core.probes.locks import lock_holders
from trainroom.core.probes.procs import (
    PROC,
    group_activity,
    group_states,
    host_process_duplicates,
    scan,
    trainer_duplicates,
)
from trainroom.core.probes.ptable import ProcessTable, with_gpu
from trainroom.core.probes.workers import WorkerFinder
from trainroom.core.samples import (
    GONE_STATES,
    Duplicate,
    GpuSample,
    HostSample,
    Leftover,
    ProcRow,
    ProcsSample,
    Worker,
)
from trainroom.core.wire import protocol as p


class ProbeTargets(msgspec.Struct, kw_only=True, frozen=True):
    """What one cycle looks at, read from the run on the keeper's loop thread."""

    attempt: int = 0
    pid: int = 0
    pgid: int = 0
    alive: bool = False
    argv: list[str] = []
    cwd: str = ""
    rank_pids: list[int] = []
    run_id: str = ""
    run_created: float = 0.0


class ProbeSweep:
    """GPU, host RAM, the attempt's process states and main-thread activity (its group, and
    its rank processes wherever their session: probes.workers), lock holders and duplicates. Duplicates scan every process's command line, so they run every
    `duplicate_every` cycles and the last answer is repeated in between."""

    def __init__(
        self,
        *,
        lock_paths: Iterable[str] = (),
        host_process_names: Iterable[str] = (),
        nvml: Nvml | None = None,
        gpu: GpuProbe | None = None,
        host: HostProbe | None = None,
        proc_root: str = PROC,
        clock: Callable[[], float] = time.time,
        duplicate_every: int = 2,
        gpu_events: GpuEventWatch | None = None,
    ) -> None:
        self.lock_paths = list(lock_paths)
        self.host_process_names = list(host_process_names)
        self.clock = clock
        self.proc_root = proc_root
        self.gpu = gpu if gpu is not None else GpuProbe(nvml, clock=clock, proc_root=proc_root)
        self.host = host if host is not None else HostProbe(proc_root=proc_root, clock=clock)
        self.duplicate_every = max(1, duplicate_every)
        self._cycle = 0
        self._duplicates: list[Duplicate] = []
        self._leftovers: list[Leftover] = []
        self._scanned_live: int | None = None  # the live attempt the last leftover scan knew
        self.workers = WorkerFinder(proc_root)
        # The kernel log's and NVML's Xids (threads of its own; the keeper's sweep has one).
        self.gpu_events = gpu_events
        self.table = ProcessTable(proc_root)

    def procs(self, targets: ProbeTargets) -> ProcsSample:
        states: dict[int, str] = {}
        workers: list[Worker] = []
        rows: list[ProcRow] = []
        if targets.alive and targets.pgid > 0:
            table = scan(self.proc_root)  # one walk: the group, and the tree below the leader
            states = group_states(targets.pgid, self.proc_root, table)
            workers = self.workers.find(table, targets.pid)
            rows = self.table.rows(table, targets.pid, targets.pgid, workers)
        running = {w.pid for w in workers if w.state not in GONE_STATES}
        watched = sorted(({targets.pid, *targets.rank_pids} & set(states)) | running)
        live_now = targets.attempt if targets.alive else None
        # A scan at its cadence, and at once when the live attempt changed: what its processes
        # left behind is a leftover from that moment on (a resting keeper reads it to rest).
        if self._cycle % self.duplicate_every == 0 or live_now != self._scanned_live:
            found: list[Duplicate] = []
            if targets.argv:
                dup = trainer_duplicates(
                    targets.argv,
                    targets.cwd,
                    trainer_pid=targets.pid if targets.alive else None,
                    own_pgid=targets.pgid or None,
                    run_id=targets.run_id,
                )
                if dup is not None:
                    found.append(dup)
            found += host_process_duplicates(self.host_process_names)
            self._duplicates = found
            # The same scan's cadence: reading every process's environment is not free.
            self._leftovers = run_leftovers(targets.run_id, targets.run_created, live_now)
            self._scanned_live = live_now
        return ProcsSample(
            attempt=targets.attempt,
            pgid=targets.pgid,
            states=states,
            activity=group_activity(watched, self.proc_root),
            workers=workers,
            locks=lock_holders(self.lock_paths, proc_root=self.proc_root),
            duplicates=self._duplicates,
            leftovers=self._leftovers,
            table=rows,
        )

    def sample(self, targets: ProbeTargets) -> p.ProbeSample:
        """One cycle; never raises (each probe degrades to an unavailable reading of its own,
        and what it raised is kept in `faults`: a bug the keeper turns into INTERNAL_ERROR)."""
        t = self.clock()
        faults: dict[str, str] = {}
        try:
            failpoints.check("probe.procs")
            procs = self.procs(targets)
        except Exception as exc:
            faults["probe.procs"] = _fault_text(exc)
            procs = ProcsSample(
                attempt=targets.attempt, pgid=targets.pgid, error=f"{type(exc).__name__}: {exc}"
            )
        ours = (
            set(procs.states)
            | {w.pid for w in procs.workers}
            | set(targets.rank_pids)
            | ({targets.pid} if targets.alive else set())
        )
        try:
            failpoints.check("probe.gpu")
            gpu = self.gpu.sample(our_pids=ours)
        except Exception as exc:
            faults["probe.gpu"] = _fault_text(exc)
            gpu = GpuSample(
                t=t, available=False, reason=f"driver view unavailable: {type(exc).__name__}: {exc}"
            )
        if self.gpu_events is not None:
            try:
                failpoints.check("probe.gpu_events")
                gpu = self.gpu_events.take(gpu, targets.attempt)
            except Exception as exc:
                faults["probe.gpu_events"] = _fault_text(exc)
        try:
            failpoints.check("probe.host")
            host = self.host.sample()
        except Exception as exc:
            faults["probe.host"] = _fault_text(exc)
            host = HostSample(
                t=t, available=False, reason=f"host memory view unavailable: {type(exc).__name__}: {exc}"
            )
        if procs.table:
            procs = msgspec.structs.replace(procs, table=with_gpu(procs.table, gpu))
        self._cycle += 1
        return p.ProbeSample(t=t, gpu=gpu, host=host, procs=procs, faults=faults)

    def close(self) -> None:
        if self.gpu_events is not None:
            self.gpu_events.close()
        self.gpu.close()


def _fault_text(exc: BaseException) -> str:
    """ "Type: message" then the traceback's tail, as ProbeSample.faults carries it."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}\n{tb[-4000:]}"
