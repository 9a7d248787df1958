"""The driver's view of the GPU through NVML (nvidia-ml-py's `pynvml`): device memory, utilisation,
power, and per-process memory where the driver reports it.

Field notes this follows (DESIGN.md): initialise NVML once and call it in-process (polling
nvidia-smi under WSL leaks the driver's non-paged pool); probe ComputeRunningProcesses `_v3`,
then `_v2`, then v1, since the struct changed across drivers; `usedGpuMemory` of ULLONG_MAX (or
None, as nvidia-ml-py reports it) is N/A under WSL2/WDDM and MIG, a normal value, not an error:
the sample says so and the watchdog falls back to device totals; one failing field never breaks
a sample; zombie contexts can report junk utilisation (nvtop saw 37100 %): over 100 is dropped.
Without a driver `nvmlInit` raises NVMLError_LibraryNotFound and the sample says
"driver view unavailable: NVML Shared Library Not Found".

A sample is a `samples.GpuSample` (it travels in protocol.ProbeSample.gpu).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from typing import Protocol, TypeVar

from trainroom.core.probes.gpuhealth import read_bus_id, read_health
from trainroom.core.probes.procs import PROC, read_stat
from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample, VramFloor
from trainroom.core.vocab import PidNamespace

# /proc/self/ns/pid of the initial PID namespace (PROC_PID_INIT_INO in the kernel).
HOST_PID_NS_INODE = 0xEFFFFFFC
ULLONG_MAX = (1 << 64) - 1
LOST_WORDS = "GPU is lost"  # str(NVMLError_GpuIsLost)
PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
PER_PROCESS_NA = (
    "per-process GPU memory is N/A from this driver (WSL2/WDDM or MIG): device totals stand in for it"
)
A = TypeVar("A")
T = TypeVar("T")
# The note a sample carries when no ComputeRunningProcesses variant answered: its empty process
# list then says nothing about who holds memory.
PROCESSES_UNAVAILABLE = "compute processes unavailable"
FOREIGN_NAMESPACE = (
    "not in the host PID namespace: the driver's PIDs may not exist here, so they are not called orphans"
)


class NvmlMemory(Protocol):
    used: int
    total: int


class NvmlUtilization(Protocol):
    gpu: int


class NvmlProcess(Protocol):
    pid: int  # usedGpuMemory is read with getattr: v1 structs of old bindings may lack it


class Nvml(Protocol):
    """What the probe calls of `pynvml` (the module, or `fake_nvml` standing where it stands)."""

    NVMLError: type[Exception]
    NVMLError_FunctionNotFound: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> NvmlMemory: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object, /) -> NvmlUtilization: ...
    def nvmlDeviceGetPowerUsage(self, handle: object, /) -> int: ...


def load_nvml() -> Nvml:
    """The fake at the pynvml boundary when $TRAINROOM_FAKE_NVML names a scenario, else pynvml."""
    from trainroom.core.probes import fake_nvml

    if os.environ.get(fake_nvml.ENV):
        return fake_nvml.DEFAULT  # the fake driver the module's functions belong to
    import pynvml

    nvml: Nvml = pynvml
    return nvml


def pid_namespace(proc_root: str = PROC) -> PidNamespace:
    """'host' in the initial PID namespace, 'container' in another, 'unknown' if /proc won't say."""
    try:
        return "host" if os.stat(f"{proc_root}/self/ns/pid").st_ino == HOST_PID_NS_INODE else "container"
    except OSError:
        return "unknown"


def _cmdline(pid: int, proc_root: str) -> list[str]:
    try:
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _text(v: str | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class GpuProbe:
    """Samples NVML once per probe cycle. Thread-safe enough for one caller thread at a time
    (the keeper's probe worker); `sample()` never raises."""

    def __init__(
        self,
        nvml: Nvml | None = None,
        *,
        clock: Callable[[], float] = time.time,
        proc_root: str = PROC,
        retry_init_s: float = 30.0,
    ) -> None:
        self.nvml = nvml if nvml is not None else load_nvml()
        self.clock = clock
        self.proc_root = proc_root
        self.retry_init_s = retry_init_s
        self._initialized = False
        self._init_error: str | None = None
        self._init_tried_at: float | None = None
        self._process_fn: str | None = None  # the ComputeRunningProcesses variant that worked
        self._namespace = pid_namespace(proc_root)
        # Once the driver has given a per-process figure it gives them all along: a later empty
        # process list then means nobody holds memory, not that nobody can tell.
        self.reports_per_process = False
        # Per device, the newest per-process utilisation sample seen (NVML's microseconds): the
        # next call asks only for samples after it.
        self._util_seen: dict[int, int] = {}
        self.process_util_note: str | None = None  # why the driver gives no per-process utilisation

    # ------------------------------------------------------------------ lifecycle

    def _ensure_init(self, now: float) -> bool:
        if self._initialized:
            return True
        if self._init_tried_at is not None and now - self._init_tried_at < self.retry_init_s:
            return False
        self._init_tried_at = now
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            self._init_error = str(exc)
            return False
        except Exception as exc:  # a broken binding is still only "unavailable"
            self._init_error = f"{type(exc).__name__}: {exc}"
            return False
        self._initialized, self._init_error = True, None
        return True

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    # ------------------------------------------------------------------ sample

    def _unavailable(self, t: float, why: str) -> GpuSample:
        return GpuSample(
            t=t, available=False, reason=f"driver view unavailable: {why}", pid_namespace=self._namespace
        )

    def sample(self, our_pids: Collection[int] = ()) -> GpuSample:
        t = self.clock()
        if not self._ensure_init(t):
            return self._unavailable(t, self._init_error or "NVML not initialised")
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            # GpuIsLost, DriverNotLoaded after an update, Uninitialized: start over next time.
            self.close()
            self._init_tried_at = t
            self._init_error = str(exc) if isinstance(exc, nvml.NVMLError) else f"{type(exc).__name__}: {exc}"
            return self._unavailable(t, self._init_error)
        notes: list[str] = []
        devices: list[GpuDevice] = []
        processes: list[GpuProcess] = []
        ours = set(our_pids)
        for i in range(count):
            handle = self._field(notes, i, "handle", nvml.nvmlDeviceGetHandleByIndex, i)
            if handle is None:  # NVML's GPU_IS_LOST for it: the device fell off the bus
                devices.append(GpuDevice(index=i, lost=bool(notes) and notes[-1].endswith(LOST_WORDS)))
                continue
            devices.append(self._device(notes, i, handle))
            processes += self._processes(notes, i, handle, ours)
        known = [x.used_bytes is not None for x in processes]
        per_process: bool | None = True if any(known) else (False if known else None)
        if per_process:
            self.reports_per_process = True
        if per_process is False:
            notes.append(PER_PROCESS_NA)
        if processes and self._namespace != "host" and any(not x.exists for x in processes):
            notes.append(FOREIGN_NAMESPACE)
        return GpuSample(
            t=t,
            available=True,
            per_process=per_process,
            pid_namespace=self._namespace,
            notes=notes,
            devices=devices,
            processes=processes,
        )

    def floor(self) -> VramFloor | None:
        """The devices' used memory now, as the floor an attempt about to start is judged
        against; None: the driver view is unavailable."""
        sample = self.sample()
        if not sample.available:
            return None
        return VramFloor(
            t=sample.t,
            used_bytes=[d.used_bytes for d in sample.devices],
            per_process=sample.per_process,
        )

    def _device(self, notes: list[str], i: int, handle: object) -> GpuDevice:
        """One device's fields, each on its own: one that fails leaves a note and a None."""
        nvml = self.nvml
        name = self._field(notes, i, "name", nvml.nvmlDeviceGetName, handle)
        mem = self._field(notes, i, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        util = self._field(notes, i, "utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        gpu_util: int | None = int(util.gpu) if util is not None else None
        if gpu_util is not None and not 0 <= gpu_util <= 100:
            notes.append(
                f"device {i}: utilisation sample {gpu_util} % dropped (junk, as zombie contexts report)"
            )
            gpu_util = None
        power = self._field(notes, i, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        bus_id, lost = read_bus_id(nvml, handle)
        health, lost_now = read_health(nvml, handle, i, notes)
        return GpuDevice(
            index=i,
            name=_text(name) if name is not None else None,
            used_bytes=int(mem.used) if mem is not None else None,
            total_bytes=int(mem.total) if mem is not None else None,
            util_percent=gpu_util,
            power_w=round(int(power) / 1000.0, 1) if power is not None else None,  # NVML says milliwatts
            pci_bus_id=bus_id,
            lost=lost or lost_now,
            health=health,
            temperature_c=health.temp_c if health is not None else None,
        )

    def _process_util(self, i: int, handle: object) -> dict[int, int]:
        """pid -> the SM utilisation of its newest sample since the last call (NVML keeps a
        ring of samples per process); empty when the driver has none or no such function."""
        fn = getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            self.process_util_note = "per-process utilisation: not in this NVML binding"
            return {}
        try:
            samples = list(fn(handle, self._util_seen.get(i, 0)))
        except self.nvml.NVMLError as exc:
            # NOT_FOUND: no process ran a kernel since the last call (an idle GPU), not an error.
            not_found = getattr(self.nvml, "NVMLError_NotFound", None)
            if not_found is None or not isinstance(exc, not_found):
                self.process_util_note = f"per-process utilisation unavailable: {exc}"
            return {}
        except Exception as exc:
            self.process_util_note = f"per-process utilisation unavailable: {type(exc).__name__}: {exc}"
            return {}
        newest: dict[int, tuple[int, int]] = {}
        for smp in samples:
            pid, ts, sm = int(smp.pid), int(smp.timeStamp), int(smp.smUtil)
            if 0 <= sm <= 100 and (pid not in newest or ts > newest[pid][0]):
                newest[pid] = (ts, sm)
            self._util_seen[i] = max(self._util_seen.get(i, 0), ts)
        self.process_util_note = None
        return {pid: sm for pid, (_, sm) in newest.items()}

    def _processes(self, notes: list[str], i: int, handle: object, ours: set[int]) -> list[GpuProcess]:
        out = []
        listed = self._compute_processes(notes, i, handle)
        util = self._process_util(i, handle) if listed else {}
        for proc in listed:
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            st = read_stat(pid, self.proc_root) if pid > 0 else None
            out.append(
                GpuProcess(
                    pid=pid,
                    device=i,
                    used_bytes=None if used is None or int(used) >= ULLONG_MAX else int(used),
                    exists=st is not None,
                    ours=pid in ours,
                    state=st.state if st is not None else None,
                    # Only the run's own rows are named: a GHOST_MEMORY finding says which of its
                    # processes holds memory, and a targeted kill proves it by its start.
                    start_ticks=st.start_ticks if st is not None and pid in ours else None,
                    cmdline=_cmdline(pid, self.proc_root) if st is not None and pid in ours else [],
                    util_percent=util.get(pid),
                )
            )
        return out

    def _field(self, notes: list[str], index: int, what: str, fn: Callable[[A], T], arg: A) -> T | None:
        try:
            return fn(arg)
        except self.nvml.NVMLError as exc:
            notes.append(f"device {index}: {what} unavailable: {exc}")
        except Exception as exc:
            notes.append(f"device {index}: {what} unavailable: {type(exc).__name__}: {exc}")
        return None

    def _compute_processes(self, notes: list[str], index: int, handle: object) -> list[NvmlProcess]:
        names = (self._process_fn,) if self._process_fn else PROCESS_FUNCTIONS
        last: str | None = None
        for name in names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                procs: list[NvmlProcess] = list(fn(handle))
            except self.nvml.NVMLError_FunctionNotFound:
                continue  # an older driver: try the older struct
            except self.nvml.NVMLError as exc:
                last = str(exc)
                continue
            except Exception as exc:  # e.g. the binding's own version-mismatch error
                last = f"{type(exc).__name__}: {exc}"
                continue
            self._process_fn = name
            return procs
        if self._process_fn and names == (self._process_fn,):
            self._process_fn = None  # the remembered variant failed: probe them all next time
        notes.append(
            f"device {index}: {PROCESSES_UNAVAILABLE}: {last or 'no ComputeRunningProcesses function'}"
        )
        return []
