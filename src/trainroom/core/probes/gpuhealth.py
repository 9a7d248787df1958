"""A device's health through NVML, each field on its own: ECC counts (volatile and aggregate,
corrected and uncorrected), retired pages and remapped rows, the clock event (throttle) reasons,
temperature and power against their limits, the PCIe link against its max.

NotSupported is a normal answer (no ECC on a GeForce, no page retirement on an H100, which
remaps rows instead; no row remapping before Ampere): that figure is None and nothing is said. A
binding without `nvmlDeviceGetCurrentClocksEventReasons` (or a driver that lacks it) is asked the
older `nvmlDeviceGetCurrentClocksThrottleReasons`. GPU_IS_LOST on any field marks the device lost.
Any other error leaves a note and a None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainroom.core.probes.xid import norm_bus
from trainroom.core.samples import GpuHealth

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST
CORRECTED, UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
VOLATILE, AGGREGATE = 0, 1  # NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC
RETIRED_SBE, RETIRED_DBE = 0, 1  # NVML_PAGE_RETIREMENT_CAUSE_*
TEMP_GPU = 0  # NVML_TEMPERATURE_GPU
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1  # NVML_TEMPERATURE_THRESHOLD_*


class _Reader:
    def __init__(self, nvml: Any, handle: object, index: int, notes: list[str]) -> None:
        self.nvml, self.handle, self.index, self.notes = nvml, handle, index, notes
        self.lost = False
        self.any = False

    def get(self, what: str, fn_name: str, *args: int) -> Any:
        fn: Callable[..., Any] | None = getattr(self.nvml, fn_name, None)
        if fn is None or self.lost:
            return None
        try:
            value = fn(self.handle, *args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == GPU_IS_LOST:
                self.lost = True
            elif code not in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
                self.notes.append(f"device {self.index}: {what} unavailable: {exc}")
            return None
        except Exception as exc:  # a binding's own error: still only this field
            self.notes.append(f"device {self.index}: {what} unavailable: {type(exc).__name__}: {exc}")
            return None
        self.any = True
        return value


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None


def _watts(mw: Any) -> float | None:
    return round(int(mw) / 1000.0, 1) if mw is not None else None


def read_health(nvml: Any, handle: object, index: int, notes: list[str]) -> tuple[GpuHealth | None, bool]:
    """The device's health figures (None: NVML gave none of them) and whether it is lost."""
    r = _Reader(nvml, handle, index, notes)
    ecc = "nvmlDeviceGetTotalEccErrors"
    retired_sbe = r.get("retired pages", "nvmlDeviceGetRetiredPages", RETIRED_SBE)
    retired_dbe = r.get("retired pages", "nvmlDeviceGetRetiredPages", RETIRED_DBE)
    pending = r.get("retired pages pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    remap = r.get("remapped rows", "nvmlDeviceGetRemappedRows")
    reasons = r.get("clock event reasons", "nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:
        reasons = r.get("clock throttle reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    health = GpuHealth(
        ecc_volatile_sbe=_int(r.get("ECC counts", ecc, CORRECTED, VOLATILE)),
        ecc_volatile_dbe=_int(r.get("ECC counts", ecc, UNCORRECTED, VOLATILE)),
        ecc_aggregate_sbe=_int(r.get("ECC counts", ecc, CORRECTED, AGGREGATE)),
        ecc_aggregate_dbe=_int(r.get("ECC counts", ecc, UNCORRECTED, AGGREGATE)),
        retired_sbe=len(retired_sbe) if retired_sbe is not None else None,
        retired_dbe=len(retired_dbe) if retired_dbe is not None else None,
        retired_pending=bool(pending) if pending is not None else None,
        remap_correctable=int(remap[0]) if remap is not None else None,
        remap_uncorrectable=int(remap[1]) if remap is not None else None,
        remap_pending=bool(remap[2]) if remap is not None else None,
        remap_failed=bool(remap[3]) if remap is not None else None,
        clock_reasons=_int(reasons),
        temp_c=_int(r.get("temperature", "nvmlDeviceGetTemperature", TEMP_GPU)),
        temp_slowdown_c=_int(
            r.get("temperature limit", "nvmlDeviceGetTemperatureThreshold", THRESHOLD_SLOWDOWN)
        ),
        temp_shutdown_c=_int(
            r.get("temperature limit", "nvmlDeviceGetTemperatureThreshold", THRESHOLD_SHUTDOWN)
        ),
        power_limit_w=_watts(r.get("power limit", "nvmlDeviceGetEnforcedPowerLimit")),
        power_default_limit_w=_watts(
            r.get("default power limit", "nvmlDeviceGetPowerManagementDefaultLimit")
        ),
        pcie_gen=_int(r.get("PCIe link", "nvmlDeviceGetCurrPcieLinkGeneration")),
        pcie_gen_max=_int(r.get("PCIe link", "nvmlDeviceGetMaxPcieLinkGeneration")),
        pcie_width=_int(r.get("PCIe link", "nvmlDeviceGetCurrPcieLinkWidth")),
        pcie_width_max=_int(r.get("PCIe link", "nvmlDeviceGetMaxPcieLinkWidth")),
    )
    return (health if r.any else None), r.lost


def read_bus_id(nvml: Any, handle: object) -> tuple[str | None, bool]:
    """The device's PCI bus id, as the kernel spells it, and whether NVML said it is lost."""
    try:
        return norm_bus(nvml.nvmlDeviceGetPciInfo(handle).busId), False
    except nvml.NVMLError as exc:
        return None, getattr(exc, "value", None) == GPU_IS_LOST
    except Exception:
        return None, False
