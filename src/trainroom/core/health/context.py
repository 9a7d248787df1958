"""What the watchdog's rules read besides the run: the latest probe results and the thresholds
(`WatchContext`), and the little that must outlive one call (`Memory`: a ghost seen for two probe
cycles, how long a pid has sat in D, when a main thread last ran). Only `Watchdog.observe`
writes the memory; the rules read it."""

from __future__ import annotations

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.samples import Duplicate, GpuSample, HostSample, Leftover, LockInfo, Worker
from trainroom.core.wire import protocol as p


class WatchContext(msgspec.Struct, kw_only=True):
    """What the watchdog needs beyond RunState: thresholds, the latest probe results, life."""

    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)
    # The keeper's pidfd/psutil view of the attempt's main pid; None: unknown (trust the record).
    alive: bool | None = None
    # The attempt's process group members (probes.procs.group_states keys).
    attempt_pids: list[int] = []
    gpu: GpuSample | None = None  # probes.gpu.GpuProbe.sample()
    host: HostSample | None = None  # probes.host.HostProbe.sample()
    # pid -> state letter: the attempt's group (probes.procs.group_states) and its workers.
    proc_states: dict[int, str] = {}
    # The attempt's rank processes found through the process tree (probes.workers), any session.
    workers: list[Worker] = []
    activity: dict[int, int] = {}  # pid -> main-thread activity counter (probes.procs.group_activity)

    def worker_rank(self, pid: int) -> int | None:
        """The rank whose process `pid` is, when it is a worker the probes found."""
        for w in self.workers:
            if w.pid == pid:
                return w.rank
        return None

    locks: list[LockInfo] = []  # probes.locks.lock_holders()
    duplicates: list[Duplicate] = []  # probes.procs.trainer_duplicates / host_process_duplicates
    leftovers: list[Leftover] = []  # probes.leftovers: live processes of this run of no live attempt
    # The last traceback of trainer.log (crash_from_log) when the reporter sent no Crash.
    log_crash: p.Crash | None = None
    # When the probe cycle behind proc_states/activity ran; None: unknown (taken as fresh).
    probe_t: float | None = None


class Memory(msgspec.Struct, kw_only=True):
    """What the Watchdog keeps between calls; rules read it, only Watchdog.observe writes it."""

    attempt: int = 0
    gpu_t: float | None = None  # the last GPU sample seen (cycles count on new samples only)
    ghost_streak: int = 0
    busy_streak: dict[int, int] = {}  # device index -> consecutive busy-with-nothing-of-ours cycles
    orphan_streak: dict[int, int] = {}  # driver pid -> consecutive cycles listed while gone or a zombie
    d_since: dict[int, float] = {}  # pid -> when it was first seen in D (reset on any other state)
    activity: dict[int, int] = {}  # pid -> last activity counter
    active_at: dict[int, float] = {}  # pid -> when that counter last moved (or was first seen)
    activity_t: float | None = None  # the probe cycle behind the latest activity counters

    def activity_fresh(self, now: float, th: Thresholds) -> bool:
        """A counter that stood still only says "parked" if the probe kept reading it: a probe
        cycle that itself stalled (a slow /proc, a wedged NVML call) must not make a busy loop
        look parked."""
        return self.activity_t is None or now - self.activity_t <= th.park_slack_s

    def main_thread_parked(self, pid: int | None, now: float, bound: float, th: Thresholds) -> bool | None:
        """True: the main thread has not run for `bound`; False: it ran; None: no (fresh)
        activity data."""
        if pid is None or pid not in self.active_at or not self.activity_fresh(now, th):
            return None
        return now - self.active_at[pid] > bound
