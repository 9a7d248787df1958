"""The faults that are the GPU's, not the trainer's: GPU_LOST and GPU_XID from the kernel's word
and NVML's events (probes.gpuevents), GPU_ECC, GPU_THROTTLED and GPU_LINK_DEGRADED from NVML's
health figures (probes.gpuhealth). Each is said in words with its figures and where it came from.

Only the run's devices are judged: those its processes are listed on (GpuSample.ours). Where the
driver lists none (no process yet, per-process N/A), every device is, but only when there is one
(a lone GPU is the run's); an Xid on a bus no process of the run is on is not this run's finding.

Throttling that is the GPU working as designed is not a finding: idle clocks, application clocks,
sync boost, the display; the power cap only when the enforced limit is below the board's default
(someone lowered it: `nvidia-smi -pl`), since a busy data-centre GPU sits at its default power
cap by design. A PCIe generation below the max is only read while the device is busy (links
train down at idle to save power); a narrower width always counts.
"""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.health.context import WatchContext
from trainroom.core.probes.xid import xid_kind
from trainroom.core.samples import GpuDevice, GpuEvent, GpuSample

# nvmlClocksEventReason* bits that mean the clocks are held down against the work.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
REASON_WORDS = {
    SW_THERMAL: "thermal slowdown (software)",
    HW_THERMAL: "thermal slowdown (hardware)",
    HW_SLOWDOWN: "hardware slowdown",
    HW_POWER_BRAKE: "power brake (the board's external power)",
    SW_POWER_CAP: "power cap",
}
BUSY_PERCENT = 50  # a link's generation is judged only above this utilisation


def run_devices(gpu: GpuSample) -> list[GpuDevice]:
    """The devices the run's processes are on (a lone device when none is listed)."""
    ours = {x.device for x in gpu.ours}
    if ours:
        return [d for d in gpu.devices if d.index in ours]
    return list(gpu.devices) if len(gpu.devices) == 1 else []


def _judged(gpu: GpuSample, every: bool) -> list[GpuDevice]:
    """The run's devices, or (`every`: `doctor` for the host) all of them."""
    return list(gpu.devices) if every else run_devices(gpu)


def _name(dev: int | None, bus: str | None, gpu: GpuSample | None) -> str:
    named = next((d.name for d in (gpu.devices if gpu else []) if d.index == dev and d.name), None)
    where = ", ".join(x for x in (bus, named) if x)
    head = f"GPU {dev}" if dev is not None else "a GPU"
    return f"{head} ({where})" if where else head


def gpu_event_findings(ctx: WatchContext) -> list[Finding]:
    """GPU_LOST for a fall off the bus (Xid 79, the kernel's words, NVML's GPU_IS_LOST) of the
    run's device; GPU_XID for any other Xid there, with its meaning and what to do."""
    gpu = ctx.gpu
    if gpu is None:
        return []
    out: list[Finding] = []
    for e in gpu.events:
        if not e.ours:
            continue  # another GPU's: not this run's finding
        if e.lost:
            out.append(_lost(e, gpu))
        elif e.xid is not None:
            out.append(_xid(e, gpu))
    return _unique(out)


def _evidence(e: GpuEvent) -> dict[str, object]:
    return {
        "device": e.device,
        "bus_id": e.bus_id,
        "xid": e.xid,
        "source": e.source,
        "line": e.text,
        "t": e.t,
    }


def _lost(e: GpuEvent, gpu: GpuSample) -> Finding:
    said = f"Xid {e.xid}" if e.xid is not None else "the driver"
    return Finding(
        code="GPU_LOST",
        severity="critical",
        key=e.bus_id or str(e.device),
        message=(
            f"{_name(e.device, e.bus_id, gpu)} fell off the bus ({said}, read from {e.source}): "
            "nothing on it can run until the node is drained and the GPU reset or reseated; "
            "do not resume on it"
        ),
        evidence={**_evidence(e), "what_to_do": "drain the node"},
    )


def _xid(e: GpuEvent, gpu: GpuSample) -> Finding:
    kind = xid_kind(e.xid)
    return Finding(
        code="GPU_XID",
        severity="critical" if kind.critical else "warning",
        key=f"{e.bus_id or e.device}:{e.xid}",
        message=(
            f"Xid {e.xid} on {_name(e.device, e.bus_id, gpu)}: {kind.meaning} "
            f"(read from {e.source}): {kind.action}"
        ),
        evidence={**_evidence(e), "meaning": kind.meaning, "what_to_do": kind.action},
    )


def _unique(fs: list[Finding]) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for f in fs:
        seen.setdefault(f.ident, f)
    return list(seen.values())


# --------------------------------------------------------------------------- NVML health


def ecc_findings(ctx: WatchContext, every: bool = False) -> list[Finding]:
    """GPU_ECC: uncorrectable errors since the driver loaded, a retirement or remap pending (it
    takes effect at the next reset: until then the bad memory is still in use), a remap failed."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    out = []
    for d in _judged(gpu, every):
        h = d.health
        if h is None:
            continue
        said = []
        if h.ecc_volatile_dbe:
            said.append(f"{h.ecc_volatile_dbe} uncorrectable (double-bit) ECC errors since the driver loaded")
        if h.retired_pending:
            said.append("a page retirement waits for a GPU reset")
        if h.remap_pending:
            said.append("a row remap waits for a GPU reset")
        if h.remap_failed:
            said.append("a row remap failed")
        if not said:
            continue
        fix = (
            "drain the node: the GPU needs service"
            if h.remap_failed
            else "reset the GPU before resuming on it"
        )
        out.append(
            Finding(
                code="GPU_ECC",
                severity="critical",
                key=str(d.index),
                message=f"{_name(d.index, d.pci_bus_id, gpu)}: {'; '.join(said)}: {fix}",
                evidence={
                    "device": d.index,
                    "bus_id": d.pci_bus_id,
                    "ecc_volatile_sbe": h.ecc_volatile_sbe,
                    "ecc_volatile_dbe": h.ecc_volatile_dbe,
                    "ecc_aggregate_sbe": h.ecc_aggregate_sbe,
                    "ecc_aggregate_dbe": h.ecc_aggregate_dbe,
                    "retired_sbe": h.retired_sbe,
                    "retired_dbe": h.retired_dbe,
                    "retired_pending": h.retired_pending,
                    "remap_pending": h.remap_pending,
                    "remap_failed": h.remap_failed,
                    "source": "NVML",
                },
            )
        )
    return out


def throttle_words(d: GpuDevice) -> str | None:
    """What holds the device's clocks down, in words with its figures; None: nothing that counts."""
    h = d.health
    if h is None or h.clock_reasons is None:
        return None
    bits = h.clock_reasons
    lowered = (
        h.power_limit_w is not None
        and h.power_default_limit_w is not None
        and h.power_limit_w < h.power_default_limit_w
    )
    if not lowered:
        bits &= ~SW_POWER_CAP
    reasons = [w for bit, w in REASON_WORDS.items() if bits & bit]
    if not reasons:
        return None
    figures = []
    if h.temp_c is not None:
        limit = f" (slowdown at {h.temp_slowdown_c} °C)" if h.temp_slowdown_c is not None else ""
        figures.append(f"{h.temp_c} °C{limit}")
    if d.power_w is not None and h.power_limit_w is not None:
        default = f", default {h.power_default_limit_w:.0f} W" if lowered else ""
        figures.append(f"{d.power_w:.0f} W of a {h.power_limit_w:.0f} W limit{default}")
    return ", ".join(reasons) + (f" at {', '.join(figures)}" if figures else "")


def throttled_devices(ctx: WatchContext, every: bool = False) -> list[tuple[GpuDevice, str]]:
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    return [(d, w) for d in _judged(gpu, every) if (w := throttle_words(d)) is not None]


def throttle_findings(ctx: WatchContext, every: bool = False) -> list[Finding]:
    out = []
    gpu = ctx.gpu
    for d, words in throttled_devices(ctx, every):
        h = d.health
        assert h is not None
        out.append(
            Finding(
                code="GPU_THROTTLED",
                severity="warning",
                key=str(d.index),
                message=(
                    f"{_name(d.index, d.pci_bus_id, gpu)} is throttled: {words}: "
                    "cool it or restore its power limit; its steps run slower meanwhile"
                ),
                evidence={
                    "device": d.index,
                    "bus_id": d.pci_bus_id,
                    "cause": words.split(" at ")[0],
                    "clock_reasons": h.clock_reasons,
                    "temp_c": h.temp_c,
                    "temp_slowdown_c": h.temp_slowdown_c,
                    "power_w": d.power_w,
                    "power_limit_w": h.power_limit_w,
                    "power_default_limit_w": h.power_default_limit_w,
                    "source": "NVML",
                },
            )
        )
    return out


def link_findings(ctx: WatchContext, every: bool = False) -> list[Finding]:
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    out = []
    for d in _judged(gpu, every):
        h = d.health
        if h is None:
            continue
        said = []
        if h.pcie_width is not None and h.pcie_width_max and h.pcie_width < h.pcie_width_max:
            said.append(f"x{h.pcie_width} of x{h.pcie_width_max}")
        busy = d.util_percent is not None and d.util_percent >= BUSY_PERCENT
        if busy and h.pcie_gen is not None and h.pcie_gen_max and h.pcie_gen < h.pcie_gen_max:
            said.append(f"gen {h.pcie_gen} of gen {h.pcie_gen_max} at {d.util_percent} % busy")
        if not said:
            continue
        out.append(
            Finding(
                code="GPU_LINK_DEGRADED",
                severity="warning",
                key=str(d.index),
                message=(
                    f"{_name(d.index, d.pci_bus_id, gpu)}'s PCIe link runs at {' and '.join(said)}: "
                    "host-device copies are slower; reseat the card or check the slot and riser"
                ),
                evidence={
                    "device": d.index,
                    "bus_id": d.pci_bus_id,
                    "pcie_gen": h.pcie_gen,
                    "pcie_gen_max": h.pcie_gen_max,
                    "pcie_width": h.pcie_width,
                    "pcie_width_max": h.pcie_width_max,
                    "util_percent": d.util_percent,
                    "source": "NVML",
                },
            )
        )
    return out
