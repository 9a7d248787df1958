"""A fake NVML at the pynvml function boundary, driven by a JSON scenario file.

The only stand-in the tests allow: the same function names as `pynvml` (nvidia-ml-py), the same
`NVMLError` class and subclasses (re-exported from pynvml itself, so `except
pynvml.NVMLError_LibraryNotFound` catches both), the same return shapes. The keeper uses it only
when `TRAINROOM_FAKE_NVML` names a scenario file; the file is re-read whenever it changes (inode,
mtime or size), so another process (the demo trainer's ghost-memory and orphan-context faults)
can drive what the keeper's driver view sees. A file that does not parse (caught mid-write by a
writer that does not replace atomically) leaves the previous scenario in force; a missing file
is a driver with no devices.

Scenario (every key optional):

    {
      "init_error": 12,                       # nvmlInit raises NVMLError(12): LibraryNotFound
      "driver_version": "560.94",
      "errors": {"nvmlDeviceGetCount": 15},   # any function -> the NVML error code it raises
      "process_api": "v3",                    # newest ComputeRunningProcesses the "driver" has:
                                              # "v2" -> _v3 is FunctionNotFound, "v1" -> _v2 too
      "devices": [{
        "name": "NVIDIA GeForce RTX 3060", "total_bytes": 12884901888, "used_bytes": 11811160064,
        "util_percent": 100, "util_memory_percent": 3, "power_w": 60.0,
        "persistence_mode": 1,                # 0 disabled, 1 enabled (the default)
        "pci_bus_id": "00000000:3B:00.0",     # nvmlDeviceGetPciInfo(h).busId (default: by index)
        # The health fields: a key left out is NotSupported on this device (a normal answer).
        "ecc": {"volatile": [0, 0], "aggregate": [0, 0]},   # [corrected, uncorrected]
        "retired_pages": [0, 0], "retired_pending": 0,      # [multiple single-bit, double-bit]
        "remapped_rows": [0, 0, 0, 0],        # corrected, uncorrected, pending, failure
        "clock_reasons": 0,                   # nvmlClocksEventReason* bits (Throttle* too)
        "temp_c": 45, "temp_slowdown_c": 87, "temp_shutdown_c": 92,
        "power_limit_w": 700.0, "power_default_limit_w": 700.0,
        "pcie": [5, 5, 16, 16],               # current gen, max gen, current width, max width
        "events_supported": true,             # nvmlDeviceRegisterEvents (default true)
        "lost": false,                        # true: every call on it raises GPU_IS_LOST
        "errors": {"nvmlDeviceGetPowerUsage": 3},  # per device
        "processes": [{"pid": 4242, "used_bytes": null}]
      }],
      "processes": [{"pid": 4242, "used_bytes": 8589934592, "device": 0,   # device defaults to 0
                     "util_percent": 87}],     # its nvmlDeviceGetProcessUtilization smUtil
      "events": [{"device": 0, "xid": 79}]    # critical-Xid events, each delivered once to every
                                              # event set created before it was appended
    }

`used_bytes: null` is what nvidia-ml-py returns for N/A (None); the integer 18446744073709551615
(or the string "ULLONG_MAX") is the raw value older bindings pass through. Both are N/A.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pynvml
from pynvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
)

# Every NVMLError subclass and NVML_ERROR_* code under its real name: the fake raises the real
# classes, so code written against pynvml catches the fake's errors unchanged.
_REAL_NAMES = [n for n in dir(pynvml) if n.startswith(("NVMLError", "NVML_ERROR_", "NVML_VALUE_"))]
globals().update({n: getattr(pynvml, n) for n in _REAL_NAMES})

ENV = "TRAINROOM_FAKE_NVML"
ULLONG_MAX = (1 << 64) - 1
_API_ORDER = ("v1", "v2", "v3")
XID_CRITICAL = pynvml.nvmlEventTypeXidCriticalError


class _Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id.encode()  # a c_char array: bytes, as nvidia-ml-py returns it
        self.busIdLegacy = self.busId


class _EventData:
    def __init__(self, handle: _Handle, xid: int) -> None:
        self.device = handle
        self.eventType = XID_CRITICAL
        self.eventData = xid
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF


class _EventSet:
    def __init__(self, cursor: int) -> None:
        self.cursor = cursor  # events before it were appended before the set existed
        self.devices: set[int] = set()


class _Memory:
    def __init__(self, total: int, used: int) -> None:
        self.total, self.used, self.free = total, used, max(0, total - used)


class _Utilization:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu, self.memory = gpu, memory


class _UtilSample:
    def __init__(self, pid: int, stamp: int, sm: int) -> None:
        self.pid, self.timeStamp, self.smUtil = pid, stamp, sm
        self.memUtil = self.encUtil = self.decUtil = 0


class _ProcessInfo:
    def __init__(self, pid: int, used: int | None) -> None:
        self.pid = pid
        self.usedGpuMemory = used
        self.gpuInstanceId = 0xFFFFFFFF
        self.computeInstanceId = 0xFFFFFFFF

    def __repr__(self) -> str:
        return f"<fake process pid={self.pid} usedGpuMemory={self.usedGpuMemory}>"


def _used(v: Any) -> int | None:
    if v is None:
        return None
    if v == "ULLONG_MAX":
        return ULLONG_MAX
    return int(v)


class FakeNvml:
    """One fake driver. `path=None` reads the scenario file named by $TRAINROOM_FAKE_NVML at each
    call (so a test can point the module-level functions elsewhere with monkeypatch.setenv)."""

    # The real error classes, so an instance stands where the module does (all of them are set
    # below; these two are what the probe catches).
    NVMLError: type[Exception] = pynvml.NVMLError
    NVMLError_FunctionNotFound: type[Exception] = pynvml.NVMLError_FunctionNotFound

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._path = os.fspath(path) if path is not None else None
        self._lock = threading.Lock()
        self._stamp: tuple[str, int, int, int] | None = None
        self._scenario: dict[str, Any] = {}
        self._refcount = 0
        self.calls = 0  # how many NVML functions were called (tests check init happens once)
        self.init_calls = 0

    # ------------------------------------------------------------------ scenario

    def _path_now(self) -> str | None:
        return self._path if self._path is not None else os.environ.get(ENV)

    def scenario(self) -> dict[str, Any]:
        path = self._path_now()
        with self._lock:
            if not path:
                self._stamp, self._scenario = None, {}
                return self._scenario
            try:
                st = os.stat(path)
            except OSError:
                self._stamp, self._scenario = None, {}
                return self._scenario
            stamp = (path, st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                try:
                    with open(path) as f:
                        loaded = json.load(f)
                    if isinstance(loaded, dict):
                        self._scenario = loaded
                        self._stamp = stamp
                except (OSError, ValueError):
                    pass  # torn or half-written: keep the last good scenario, retry next call
            return self._scenario

    def _enter(
        self, fn: str, device: dict[str, Any] | None = None, *, needs_init: bool = True
    ) -> dict[str, Any]:
        self.calls += 1
        sc = self.scenario()
        if needs_init and self._refcount <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        code = (sc.get("errors") or {}).get(fn)
        if code is None and device is not None:
            code = (device.get("errors") or {}).get(fn)
        if code is None and device is not None and device.get("lost"):
            code = NVML_ERROR_GPU_IS_LOST  # fallen off the bus: every call on it says so
        if code is not None:
            raise NVMLError(int(code))
        return sc

    def _device(self, handle: object) -> tuple[dict[str, Any], dict[str, Any], int]:
        sc = self.scenario()
        devices = sc.get("devices") or []
        index = getattr(handle, "index", None)
        if not isinstance(index, int) or not 0 <= index < len(devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return sc, devices[index], index

    # ------------------------------------------------------------------ pynvml functions

    def nvmlInit(self) -> None:
        self.calls += 1
        self.init_calls += 1
        sc = self.scenario()
        code = sc.get("init_error")
        if code is not None:
            raise NVMLError(int(code))
        self._refcount += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._refcount -= 1

    def nvmlErrorString(self, code: int) -> str:
        return str(NVMLError(code))

    def nvmlSystemGetDriverVersion(self) -> str:
        sc = self._enter("nvmlSystemGetDriverVersion")
        return str(sc.get("driver_version", "fake"))

    def nvmlDeviceGetCount(self) -> int:
        sc = self._enter("nvmlDeviceGetCount")
        return len(sc.get("devices") or [])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        sc = self._enter("nvmlDeviceGetHandleByIndex")
        devices = sc.get("devices") or []
        if not 0 <= index < len(devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._enter("nvmlDeviceGetHandleByIndex", devices[index])
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: object) -> str:
        _, dev, i = self._device(handle)
        self._enter("nvmlDeviceGetName", dev)
        return str(dev.get("name", f"Fake GPU {i}"))

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> _Memory:
        _, dev, _ = self._device(handle)
        self._enter("nvmlDeviceGetMemoryInfo", dev)
        return _Memory(int(dev.get("total_bytes", 0)), int(dev.get("used_bytes", 0)))

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization:
        _, dev, _ = self._device(handle)
        self._enter("nvmlDeviceGetUtilizationRates", dev)
        return _Utilization(int(dev.get("util_percent", 0)), int(dev.get("util_memory_percent", 0)))

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        _, dev, _ = self._device(handle)
        self._enter("nvmlDeviceGetPowerUsage", dev)
        return round(float(dev.get("power_w", 0.0)) * 1000)  # NVML says milliwatts

    def nvmlDeviceGetPersistenceMode(self, handle: object) -> int:
        _, dev, _ = self._device(handle)
        self._enter("nvmlDeviceGetPersistenceMode", dev)
        return int(dev.get("persistence_mode", 1))  # NVML_FEATURE_ENABLED

    def nvmlDeviceGetProcessUtilization(self, handle: object, last_seen: int) -> list[_UtilSample]:
        """A sample per process with `util_percent` in the scenario, stamped now (NOT_FOUND, as
        the driver says, when there is none)."""
        sc, dev, index = self._device(handle)
        self._enter("nvmlDeviceGetProcessUtilization", dev)
        rows = list(dev.get("processes") or [])
        rows += [p for p in sc.get("processes") or [] if int(p.get("device", 0)) == index]
        stamp = max(int(time.time() * 1e6), int(last_seen) + 1)
        out = [_UtilSample(int(p["pid"]), stamp, int(p["util_percent"])) for p in rows if "util_percent" in p]
        if not out:
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    def _processes(self, handle: object, fn: str, version: str) -> list[_ProcessInfo]:
        sc, dev, index = self._device(handle)
        self._enter(fn, dev)
        have = str(sc.get("process_api", "v3"))
        if have in _API_ORDER and _API_ORDER.index(version) > _API_ORDER.index(have):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        rows = list(dev.get("processes") or [])
        rows += [p for p in sc.get("processes") or [] if int(p.get("device", 0)) == index]
        return [_ProcessInfo(int(p["pid"]), _used(p.get("used_bytes"))) for p in rows]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object) -> list[_ProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3", "v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: object) -> list[_ProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2", "v2")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_ProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses", "v1")

    # The display's processes; nothing in the scenario, as on a headless box.
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[_ProcessInfo]:
        _, dev, _ = self._device(handle)
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", dev)
        return []

    # ------------------------------------------------------------------ health

    def _health(self, handle: object, fn: str, key: str) -> Any:
        """The device's `key`, or NotSupported when the scenario leaves it out."""
        _, dev, _ = self._device(handle)
        self._enter(fn, dev)
        if dev.get(key) is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return dev[key]

    def nvmlDeviceGetPciInfo(self, handle: object) -> _PciInfo:
        _, dev, i = self._device(handle)
        self._enter("nvmlDeviceGetPciInfo", dev)
        return _PciInfo(str(dev.get("pci_bus_id", f"00000000:{i + 1:02X}:00.0")))

    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> int:
        ecc = self._health(handle, "nvmlDeviceGetTotalEccErrors", "ecc")
        return int(ecc["aggregate" if counterType == 1 else "volatile"][1 if errorType == 1 else 0])

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: object, errorType: int, counterType: int, locationType: int
    ) -> int:
        ecc = self._health(handle, "nvmlDeviceGetMemoryErrorCounter", "ecc")
        if locationType != pynvml.NVML_MEMORY_LOCATION_DRAM:
            return 0  # every error of the scenario is in device memory
        return int(ecc["aggregate" if counterType == 1 else "volatile"][1 if errorType == 1 else 0])

    def nvmlDeviceGetRetiredPages(self, handle: object, sourceFilter: int) -> list[int]:
        pages = self._health(handle, "nvmlDeviceGetRetiredPages", "retired_pages")
        return [0x1000 * (k + 1) for k in range(int(pages[1 if sourceFilter == 1 else 0]))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:
        return int(self._health(handle, "nvmlDeviceGetRetiredPagesPendingStatus", "retired_pending"))

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:
        rows = self._health(handle, "nvmlDeviceGetRemappedRows", "remapped_rows")
        return (int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3]))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        return int(self._health(handle, "nvmlDeviceGetCurrentClocksEventReasons", "clock_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        return int(self._health(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", "clock_reasons"))

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(self._health(handle, "nvmlDeviceGetTemperature", "temp_c"))

    def nvmlDeviceGetTemperatureThreshold(self, handle: object, threshold: int) -> int:
        key = {0: "temp_shutdown_c", 1: "temp_slowdown_c"}.get(threshold)
        if key is None:
            _, dev, _ = self._device(handle)
            self._enter("nvmlDeviceGetTemperatureThreshold", dev)
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(self._health(handle, "nvmlDeviceGetTemperatureThreshold", key))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return round(float(self._health(handle, "nvmlDeviceGetEnforcedPowerLimit", "power_limit_w")) * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: object) -> int:
        w = self._health(handle, "nvmlDeviceGetPowerManagementDefaultLimit", "power_default_limit_w")
        return round(float(w) * 1000)

    def _pcie(self, handle: object, fn: str, k: int) -> int:
        return int(self._health(handle, fn, "pcie")[k])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int:
        return self._pcie(handle, "nvmlDeviceGetCurrPcieLinkGeneration", 0)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._pcie(handle, "nvmlDeviceGetMaxPcieLinkGeneration", 1)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int:
        return self._pcie(handle, "nvmlDeviceGetCurrPcieLinkWidth", 2)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return self._pcie(handle, "nvmlDeviceGetMaxPcieLinkWidth", 3)

    # ------------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> _EventSet:
        sc = self._enter("nvmlEventSetCreate")
        return _EventSet(len(sc.get("events") or []))

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: _EventSet) -> None:
        _, dev, i = self._device(handle)
        self._enter("nvmlDeviceRegisterEvents", dev)
        if not dev.get("events_supported", True):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if eventTypes & XID_CRITICAL:
            eventSet.devices.add(i)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        """The next critical-Xid event of a registered device, else Timeout after `timeoutms`."""
        deadline = time.monotonic() + max(0, timeoutms) / 1000.0
        while True:
            sc = self._enter("nvmlEventSetWait")
            events = sc.get("events") or []
            while eventSet.cursor < len(events):
                ev = events[eventSet.cursor]
                eventSet.cursor += 1
                if int(ev.get("device", 0)) in eventSet.devices:
                    return _EventData(_Handle(int(ev.get("device", 0))), int(ev["xid"]))
            if time.monotonic() >= deadline:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def nvmlEventSetWait_v2(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        return self.nvmlEventSetWait(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.devices.clear()


def write_scenario(path: str | os.PathLike[str], scenario: dict[str, Any]) -> None:
    """Write a scenario so a reader never sees half of it: a temp file beside it, then rename."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(scenario, f)
    os.replace(tmp, path)


# Module-level functions, so this module stands where `pynvml` stands: they are the methods of
# DEFAULT, which reads the scenario $TRAINROOM_FAKE_NVML names at each call.
DEFAULT = FakeNvml()
nvmlInit = DEFAULT.nvmlInit
nvmlInitWithFlags = DEFAULT.nvmlInitWithFlags
nvmlShutdown = DEFAULT.nvmlShutdown
nvmlErrorString = DEFAULT.nvmlErrorString
nvmlSystemGetDriverVersion = DEFAULT.nvmlSystemGetDriverVersion
nvmlDeviceGetCount = DEFAULT.nvmlDeviceGetCount
nvmlDeviceGetHandleByIndex = DEFAULT.nvmlDeviceGetHandleByIndex
nvmlDeviceGetName = DEFAULT.nvmlDeviceGetName
nvmlDeviceGetMemoryInfo = DEFAULT.nvmlDeviceGetMemoryInfo
nvmlDeviceGetUtilizationRates = DEFAULT.nvmlDeviceGetUtilizationRates
nvmlDeviceGetPowerUsage = DEFAULT.nvmlDeviceGetPowerUsage
nvmlDeviceGetPersistenceMode = DEFAULT.nvmlDeviceGetPersistenceMode
nvmlDeviceGetComputeRunningProcesses = DEFAULT.nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v2 = DEFAULT.nvmlDeviceGetComputeRunningProcesses_v2
nvmlDeviceGetComputeRunningProcesses_v3 = DEFAULT.nvmlDeviceGetComputeRunningProcesses_v3
nvmlDeviceGetGraphicsRunningProcesses = DEFAULT.nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetPciInfo = DEFAULT.nvmlDeviceGetPciInfo
nvmlDeviceGetTotalEccErrors = DEFAULT.nvmlDeviceGetTotalEccErrors
nvmlDeviceGetMemoryErrorCounter = DEFAULT.nvmlDeviceGetMemoryErrorCounter
nvmlDeviceGetRetiredPages = DEFAULT.nvmlDeviceGetRetiredPages
nvmlDeviceGetRetiredPagesPendingStatus = DEFAULT.nvmlDeviceGetRetiredPagesPendingStatus
nvmlDeviceGetRemappedRows = DEFAULT.nvmlDeviceGetRemappedRows
nvmlDeviceGetCurrentClocksEventReasons = DEFAULT.nvmlDeviceGetCurrentClocksEventReasons
nvmlDeviceGetCurrentClocksThrottleReasons = DEFAULT.nvmlDeviceGetCurrentClocksThrottleReasons
nvmlDeviceGetTemperature = DEFAULT.nvmlDeviceGetTemperature
nvmlDeviceGetTemperatureThreshold = DEFAULT.nvmlDeviceGetTemperatureThreshold
nvmlDeviceGetEnforcedPowerLimit = DEFAULT.nvmlDeviceGetEnforcedPowerLimit
nvmlDeviceGetPowerManagementDefaultLimit = DEFAULT.nvmlDeviceGetPowerManagementDefaultLimit
nvmlDeviceGetCurrPcieLinkGeneration = DEFAULT.nvmlDeviceGetCurrPcieLinkGeneration
nvmlDeviceGetMaxPcieLinkGeneration = DEFAULT.nvmlDeviceGetMaxPcieLinkGeneration
nvmlDeviceGetCurrPcieLinkWidth = DEFAULT.nvmlDeviceGetCurrPcieLinkWidth
nvmlDeviceGetMaxPcieLinkWidth = DEFAULT.nvmlDeviceGetMaxPcieLinkWidth
nvmlEventSetCreate = DEFAULT.nvmlEventSetCreate
nvmlDeviceRegisterEvents = DEFAULT.nvmlDeviceRegisterEvents
nvmlEventSetWait = DEFAULT.nvmlEventSetWait
nvmlEventSetWait_v2 = DEFAULT.nvmlEventSetWait_v2
nvmlEventSetFree = DEFAULT.nvmlEventSetFree
nvmlDeviceGetProcessUtilization = DEFAULT.nvmlDeviceGetProcessUtilization

__all__ = [  # the real error names first: the fake raises pynvml's own classes
    *_REAL_NAMES,
    "DEFAULT",
    "ENV",
    "FakeNvml",
    "write_scenario",
    "ULLONG_MAX",
]

# The class carries the error classes too, so a FakeNvml instance stands where the module does.
for _name in _REAL_NAMES:
    setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name
