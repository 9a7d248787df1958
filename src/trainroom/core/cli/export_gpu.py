"""`trainroom export`'s GPU health gauges, one series per device of the run's driver view.

Names are trainroom's own (`trainroom_gpu_*`): they never impersonate DCGM exporter's
`DCGM_FI_DEV_*` or nvitop-exporter's `nvitop_*` series scraped beside them. The labels are the
ones DCGM exporter writes (`gpu`: the NVML index, `pci_bus_id`; its `modelName` is spelt
`model_name`, since promtool's lint refuses camelCase label names), so a query joins
trainroom's series with DCGM's on `gpu` or `pci_bus_id` (spelt as NVML and DCGM spell it,
"00000000:3B:00.0", not the kernel's "0000:3b:00.0"). docs/alerts-and-metrics.md lists them beside
the DCGM field each mirrors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Put = Callable[[str, str, dict[str, str], Any], None]

# nvmlClocksEventReason* bits, as the `reason` label says them (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
# carries the same bits as one number).
REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

# (metric, help, health field) for the plain figures.
FIGURES = (
    ("trainroom_gpu_temperature_celsius", "GPU temperature (as DCGM_FI_DEV_GPU_TEMP)", "temp_c"),
    (
        "trainroom_gpu_slowdown_temperature_celsius",
        "Temperature at which the GPU slows down",
        "temp_slowdown_c",
    ),
    (
        "trainroom_gpu_shutdown_temperature_celsius",
        "Temperature at which the GPU shuts down",
        "temp_shutdown_c",
    ),
    (
        "trainroom_gpu_power_limit_watts",
        "The enforced power limit (as DCGM_FI_DEV_POWER_MGMT_LIMIT)",
        "power_limit_w",
    ),
    ("trainroom_gpu_power_default_limit_watts", "The board's default power limit", "power_default_limit_w"),
    (
        "trainroom_gpu_clock_event_reasons",
        "Clock event (throttle) reason bits (as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
        "clock_reasons",
    ),
    (
        "trainroom_gpu_pcie_link_generation",
        "Current PCIe link generation (as DCGM_FI_DEV_PCIE_LINK_GEN)",
        "pcie_gen",
    ),
    (
        "trainroom_gpu_pcie_link_generation_max",
        "Max PCIe link generation of the device and slot",
        "pcie_gen_max",
    ),
    (
        "trainroom_gpu_pcie_link_width",
        "Current PCIe link width, lanes (as DCGM_FI_DEV_PCIE_LINK_WIDTH)",
        "pcie_width",
    ),
    ("trainroom_gpu_pcie_link_width_max", "Max PCIe link width, lanes", "pcie_width_max"),
    (
        "trainroom_gpu_retired_pages_pending",
        "1 while a page retirement waits for a GPU reset",
        "retired_pending",
    ),
    (
        "trainroom_gpu_row_remap_pending",
        "1 while a row remap waits for a GPU reset (as DCGM_FI_DEV_ROW_REMAP_PENDING)",
        "remap_pending",
    ),
    (
        "trainroom_gpu_row_remap_failure",
        "1 when a row remap failed (as DCGM_FI_DEV_ROW_REMAP_FAILURE)",
        "remap_failed",
    ),
)
# (type label, counter label, health field): DCGM_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL.
ECC = (
    ("sbe", "volatile", "ecc_volatile_sbe"),
    ("dbe", "volatile", "ecc_volatile_dbe"),
    ("sbe", "aggregate", "ecc_aggregate_sbe"),
    ("dbe", "aggregate", "ecc_aggregate_dbe"),
)


def dcgm_bus(bus: Any) -> str:
    """ "0000:3b:00.0" (the kernel's, as trainroom keeps it) as NVML and DCGM spell it: "00000000:3B:00.0"."""
    if not isinstance(bus, str) or bus.count(":") != 2:
        return ""
    dom, b, rest = bus.split(":")
    try:
        return f"{int(dom, 16):08X}:{b.upper()}:{rest.upper()}"
    except ValueError:
        return ""


def _n(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    return float(v) if isinstance(v, (int, float)) else None


def gpu_metrics(put: Put, base: dict[str, str], gpu: dict[str, Any]) -> None:
    """The gauges of each device in `status --json`'s "gpu" section."""
    for d in gpu.get("devices") or []:
        labels = {
            **base,
            "gpu": str(d.get("index")),
            "pci_bus_id": dcgm_bus(d.get("pci_bus_id")),
            "model_name": str(d.get("name") or ""),
        }
        put(
            "trainroom_gpu_lost",
            "1 when NVML says the GPU is lost (fell off the bus)",
            labels,
            float(bool(d.get("lost"))),
        )
        put(
            "trainroom_gpu_power_watts",
            "GPU power draw (as DCGM_FI_DEV_POWER_USAGE)",
            labels,
            _n(d.get("power_w")),
        )
        h = d.get("health") or {}
        for name, doc, key in FIGURES:
            put(name, doc, labels, _n(h.get(key)))
        for kind, counter, key in ECC:
            put(
                "trainroom_gpu_ecc_errors",
                "ECC errors, by type (sbe corrected, dbe uncorrected) and counter (volatile since the "
                "driver loaded, aggregate over the device's life)",
                {**labels, "type": kind, "counter": counter},
                _n(h.get(key)),
            )
        bits = h.get("clock_reasons")
        if isinstance(bits, int):
            for reason, bit in REASONS.items():
                put(
                    "trainroom_gpu_clock_event_active",
                    "1 while this clock event (throttle) reason holds the clocks",
                    {**labels, "reason": reason},
                    float(bool(bits & bit)),
                )
    by_xid: dict[tuple[str, str], int] = {}
    for e in gpu.get("events") or []:
        if e.get("ours"):
            seen = (dcgm_bus(e.get("bus_id")), "lost" if e.get("lost") else str(e.get("xid")))
            by_xid[seen] = by_xid.get(seen, 0) + 1
    for (bus, xid), n in by_xid.items():
        put(
            "trainroom_gpu_xid_events",
            'Xids (or falls off the bus: xid="lost") on the run\'s GPUs this attempt (as DCGM_FI_DEV_XID_ERRORS)',
            {**base, "pci_bus_id": bus, "xid": xid},
            float(n),
        )
