"""What the probes read, as typed values: the driver's view of the GPU, host RAM, the attempt's
processes, lock holders, duplicates and the checkpoint disk.

One probe cycle's readings travel in `protocol.ProbeSample` (live, kept in the snapshot, never
journaled); the rules, `status` and the control room read these fields, never a dict key guessed
from a probe's format. A view the probe could not take is a normal value, not an exception:
`available=False` with the reason (`driver view unavailable: ...`), or `error` for a disk reading.
Every byte figure is in bytes; None is "not measured", never an invented zero.
"""

from __future__ import annotations

from typing import Literal

import msgspec

PidNamespace = Literal["host", "container", "unknown"]

# Kernel state letters that say a process will never run again (proc(5)).
GONE_STATES = frozenset("ZX")


# --------------------------------------------------------------------------- GPU (probes.gpu)


class GpuDevice(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One device as NVML reports it; a field NVML would not give is None."""

    index: int
    name: str | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    util_percent: int | None = None  # junk over 100 (zombie contexts) is dropped by the probe
    power_w: float | None = None


class GpuProcess(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A compute process the driver lists, with what /proc says of its pid."""

    pid: int
    device: int = 0
    # None: N/A from this driver (WSL2/WDDM, MIG): a normal value, not an error.
    used_bytes: int | None = None
    exists: bool = True  # the pid exists in our PID namespace
    ours: bool = False  # one of the run's processes
    state: str | None = None  # its kernel state letter; None when it does not exist
    # For the run's own rows: /proc/<pid>/stat field 22 (its identity for a targeted kill) and its
    # command line (the first 4 KiB), so a finding can name what holds the memory.
    start_ticks: int | None = None
    cmdline: list[str] = []

    @property
    def gone(self) -> bool:
        """The pid is not there or will never run again: a context that outlived its process."""
        return not self.exists or self.state in GONE_STATES


class GpuSample(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    t: float
    available: bool
    reason: str = ""  # why not available: "driver view unavailable: ..."
    # True: the driver gives per-process memory; False: N/A (device totals stand in); None: no
    # process was listed, so nobody knows.
    per_process: bool | None = None
    pid_namespace: PidNamespace = "unknown"
    notes: list[str] = []
    devices: list[GpuDevice] = []
    processes: list[GpuProcess] = []

    @property
    def ours(self) -> list[GpuProcess]:
        return [x for x in self.processes if x.ours]


class VramFloor(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The devices' memory read just before an attempt's trainer started: what the device holds
    with nothing of the attempt on it (a data-centre GPU with persistence mode holds ~600 MiB
    idle; a desktop GPU its display's share). Where the driver gives no per-process memory
    (WSL2/WDDM, MIG), a kill judges the release against this floor, not an absolute number."""

    t: float
    used_bytes: list[int | None] = []  # by device index; None: that device's memory unreadable
    # The driver gave per-process memory at that moment (True), gave N/A (False), or listed no
    # process to tell by (None).
    per_process: bool | None = None


# --------------------------------------------------------------------------- host (probes.host)


class CgroupMemory(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The memory cgroup this process lives in (v1 or v2)."""

    version: Literal[1, 2]
    path: str  # as /proc/self/cgroup names it
    dir: str  # where its control files were found
    limit_bytes: int | None = None  # None: no limit (or one above RAM)
    usage_bytes: int | None = None
    file_bytes: int | None = None
    inactive_file_bytes: int | None = None
    # limit - usage + inactive page cache: what the cgroup can still give.
    available_bytes: int | None = None
    reclaim_file: str | None = None  # memory.reclaim (v2, kernel >= 5.19)


class HostSample(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    t: float
    available: bool
    reason: str = ""  # why not available: "host memory view unavailable: ..."
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    page_cache_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    cgroup: CgroupMemory | None = None
    # The smaller of what the host and our cgroup can still give: what a torch.load gets.
    effective_available_bytes: int | None = None
    wsl: bool = False


# --------------------------------------------------------------------------- processes (probes.procs, probes.locks)


class LockHolder(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A process that holds (or inherited) a lock, as /proc says it is now."""

    pid: int
    exists: bool
    state: str | None = None
    state_name: str = "gone"
    pgid: int | None = None
    comm: str | None = None
    # What /proc/locks says of the lock (FLOCK/POSIX/OFDLCK, READ/WRITE); None for an inheritor.
    kind: str | None = None
    mode: str | None = None

    @property
    def gone(self) -> bool:
        return not self.exists or self.state in GONE_STATES


class LockInfo(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One configured lock file: who /proc/locks names, who keeps it through an inherited
    descriptor when that one is gone, and who waits for it."""

    path: str
    key: str | None = None  # major:minor:inode as /proc/locks spells it; None: no such file
    exists: bool = False
    held: bool = False
    holders: list[LockHolder] = []
    inheritors: list[LockHolder] = []
    waiters: list[int] = []


class Duplicate(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """Another trainer on the same command and directory, or two instances of a host process."""

    kind: Literal["trainer", "host"]
    pids: list[int]  # ours first (when ours runs), then the others
    others: list[int]
    ours: int | None = None
    name: str = ""  # the host process's name
    cmdline: list[str] = []
    cwd: str = ""


class Leftover(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A live process of this run that no live attempt owns (probes.leftovers)."""

    pid: int
    start_ticks: int | None = None
    attempt: int | None = None  # the attempt that started it (TRAINROOM_ATTEMPT)
    state: str = ""  # psutil's status: "stopped", "sleeping", ...
    cmdline: list[str] = []


class Worker(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A descendant of the attempt's leader that carries a rank in the environment it was
    started with (`RANK`, as torchrun sets it): one rank's process, whatever its session or
    group (torch elastic starts each worker in a new session)."""

    pid: int
    rank: int
    state: str  # the kernel's letter
    start_ticks: int  # /proc/<pid>/stat field 22: with the pid, the process's identity
    local_rank: int | None = None
    world_size: int | None = None
    ppid: int = 0
    pgid: int = 0
    sid: int = 0
    # torch elastic's restarts left for this worker group (TORCHELASTIC_MAX_RESTARTS less
    # TORCHELASTIC_RESTART_COUNT): 0 means a failed worker ends the attempt. None: not torch elastic.
    restarts_left: int | None = None
    # The wait status a zombie left (/proc/<pid>/stat field 52): how it ended, read before its
    # parent (torchrun, not us) reaps it. None while it runs, or where the kernel hides it.
    wait_status: int | None = None


class ProcsSample(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    attempt: int = 0  # the attempt these states were read for
    pgid: int = 0
    states: dict[int, str] = {}  # pid -> kernel state letter, the attempt's process group
    activity: dict[int, int] = {}  # pid -> main-thread activity counter (leader, ranks, workers)
    # The attempt's rank processes found through the process tree (probes.workers), by rank.
    workers: list[Worker] = []
    locks: list[LockInfo] = []
    duplicates: list[Duplicate] = []
    leftovers: list[Leftover] = []  # live processes of this run of no live attempt
    error: str | None = None  # the process probe itself failed


# --------------------------------------------------------------------------- the checkpoint disk (keeper pipeline)


class DiskSample(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    path: str
    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None  # what an unprivileged writer can still use, as df shows it
    used_fraction: float | None = None
    budget: bool = False  # the figures are a byte budget for the root, not a filesystem
    budget_bytes: int | None = None
    fstype: str | None = None
    mountpoint: str | None = None
    remote: bool | None = None
    time_to_full_s: float | None = None  # None: no projection (no writer, or under 2 saves)
    prunable_bytes: int | None = None
    latest: str | None = None  # the file a resume loads
    error: str | None = None  # the disk could not be read
    # Under a budget (`budget`), the filesystem that holds the root, as df says it: the figures
    # above are the budget's.
    fs_used_fraction: float | None = None
    fs_free_bytes: int | None = None
