"""What the probes read, as typed values: the driver's view of the GPU, host RAM, the attempt's
processes, lock holders, duplicates and the checkpoint disk.

One probe cycle's readings travel in `protocol.ProbeSample` (live, kept in the snapshot, never
journaled); the rules, `status` and the control room read these fields, never a dict key guessed
from a probe's format. A view the probe could not take is a normal value, not an exception:
`available=False` with the reason (`driver view unavailable: ...`), or `error` for a disk reading.
Every byte figure is in bytes; None is "not measured", never an invented zero.
"""

from __future__ import annotations

import msgspec

from trainroom.core.vocab import CgroupVersion, DuplicateKind, PidNamespace

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
    temperature_c: int | None = None  # health.temp_c, kept beside it for the history graphs
    # Its PCI address as the kernel writes it ("0000:3b:00.0": probes.xid.norm_bus), from
    # nvmlDeviceGetPciInfo(h).busId ("00000000:3B:00.0").
    pci_bus_id: str | None = None
    # NVML said GPU_IS_LOST for one of its fields: it fell off the bus.
    lost: bool = False
    health: GpuHealth | None = None  # None: not read (the driver gave none of it)


class GpuHealth(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A device's health figures (probes.gpuhealth); None: NotSupported on this device or
    driver, a normal answer (no ECC on a GeForce, no row remapping before Ampere)."""

    ecc_volatile_sbe: int | None = None  # corrected (single-bit) since the driver loaded
    ecc_volatile_dbe: int | None = None  # uncorrected (double-bit) since the driver loaded
    ecc_aggregate_sbe: int | None = None  # over the device's life
    ecc_aggregate_dbe: int | None = None
    retired_sbe: int | None = None  # pages retired for repeated single-bit errors
    retired_dbe: int | None = None  # pages retired for a double-bit error
    retired_pending: bool | None = None  # a retirement waits for the next GPU reset
    remap_correctable: int | None = None  # rows remapped (Ampere and later)
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None  # a remap waits for the next GPU reset
    remap_failed: bool | None = None  # a remap failed: the device needs service
    clock_reasons: int | None = None  # nvmlClocksEventReason* bits (nvmlClocksThrottleReason* of old)
    temp_c: int | None = None
    temp_slowdown_c: int | None = None  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    temp_shutdown_c: int | None = None  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    power_limit_w: float | None = None  # the enforced limit
    power_default_limit_w: float | None = None  # the board's default limit
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None


class GpuEvent(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """An Xid or a fall off the bus, from the kernel log or NVML's events (probes.gpuevents)."""

    t: float
    source: str  # "/dev/kmsg", "journalctl -k" or "nvml events"
    bus_id: str | None = None  # normalised ("0000:3b:00.0"); None: the line named none
    xid: int | None = None  # None: "GPU has fallen off the bus" without an Xid number
    lost: bool = False  # Xid 79 or "fallen off the bus"
    text: str = ""  # the kernel's line (bounded)
    pid: int | None = None  # the process the line names (an application's fault: 13, 31, 43...)
    device: int | None = None  # the NVML index of its bus; None: no device of NVML's has it
    ours: bool = False  # that device runs this run's processes


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
    # The driver's SM utilisation of this process over its last sample (nvmlDeviceGetProcessUtilization);
    # None: the driver gave no sample for it.
    util_percent: int | None = None

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
    # Xids and falls off the bus seen during this attempt (bounded, oldest dropped), and where
    # they were read from: "/dev/kmsg", "journalctl -k", or why neither ("" before a watch).
    events: list[GpuEvent] = []
    kernel_log: str = ""

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

    version: CgroupVersion
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

    kind: DuplicateKind
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


class ProcRow(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One process of the live attempt's tree (probes.ptable): the leader (the agent), the rank
    workers and every child of theirs (DataLoader workers, async savers), as nvitop lists them.
    Every figure is read from /proc or the driver this cycle; None is "not measured"."""

    pid: int
    ppid: int
    start_ticks: int  # with the pid, the process's identity (what a signal of it proves)
    role: str  # "agent" (the attempt's leader), "rank" (a worker), "child" (under either)
    state: str  # the kernel's letter
    elapsed_s: float  # since the process started
    cmdline: list[str] = []  # the first 4 KiB of /proc/<pid>/cmdline
    rank: int | None = None  # its own rank, or the rank of the worker it runs under
    cpu_percent: float | None = None  # of one core, since the previous cycle (None: first sight)
    rss_bytes: int | None = None
    write_bps: float | None = None  # bytes it wrote to storage per second since the previous cycle
    gpu_bytes: int | None = None  # what the driver lists for it (None: not listed, or N/A)
    gpu_util_percent: int | None = None


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
    # Every process of the live attempt as a tree (probes.ptable), parents before children.
    table: list[ProcRow] = []


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


# --------------------------------------------------------------------------- history (run.vitals)


class VitalsSample(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True, array_like=True):
    """The figures the history graphs draw, read from one probe cycle (and the ranks' latest
    allocator figures), journaled every few seconds (`protocol.Vitals`). None: not measured."""

    t: float
    mem_used_bytes: int | None = None  # host RAM in use (total less available)
    mem_total_bytes: int | None = None
    page_cache_bytes: int | None = None
    vram_used_bytes: int | None = None  # the driver's, summed over devices
    vram_total_bytes: int | None = None
    alloc_reserved_bytes: int | None = None  # torch's caching allocator, summed over ranks
    alloc_allocated_bytes: int | None = None
    gpu_util_percent: int | None = None  # the busiest device
    gpu_power_w: float | None = None  # summed over devices
    gpu_temp_c: int | None = None  # the hottest device
    cpu_percent: float | None = None  # the run's processes together (100 = one core)
    disk_free_bytes: int | None = None  # the checkpoint disk (or what its budget leaves)
    disk_write_bps: float | None = None  # what the run's processes wrote per second
