"""gpu_check.py's checks of the GPU's own faults, on a real GPU:

  gpu_health       the keeper's health rules over the device's real figures (ECC, pending
                   retirements/remaps, clock event reasons, temperature and power against their
                   limits, the PCIe link): a healthy H100/H200 raises nothing
  kernel_log       where a keeper reads Xids from (/dev/kmsg, journalctl -k, or why neither)
  xid_events       NVML's critical-Xid events register on the device (NotSupported: skip)
  power_cap        with `nvidia-smi -pl` allowed: the device capped at its minimum limit under the
                   matmul bench shows the power-cap reason, GPU_THROTTLED words name it, and the
                   bench says throttling explains its figure; the limit is restored, failure or not

Each returns dicts of gpu_check.Outcome's fields (name, result, detail, figures).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Any

from trainroom.core.health.context import WatchContext
from trainroom.core.health.gpufaults import ecc_findings, link_findings, throttle_findings, throttle_words
from trainroom.core.ops.bench import explain, run_bench
from trainroom.core.ops.gpu_checks import kernel_log_source
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.probes.gpuevents import XID_CRITICAL
from trainroom.core.samples import GpuSample

SW_POWER_CAP = 0x4


def _o(name: str, result: str, detail: str, **figures: Any) -> dict[str, Any]:
    return {"name": name, "result": result, "detail": detail, "figures": figures}


def check_gpu_health(nvml: Any, index: int) -> dict[str, Any]:
    probe = GpuProbe(nvml)
    try:
        sample = probe.sample()
    finally:
        probe.close()
    if not sample.available:
        return _o("gpu_health", "skip", f"skipped: {sample.reason}")
    dev = next((d for d in sample.devices if d.index == index), None)
    if dev is None or dev.health is None:
        return _o("gpu_health", "skip", f"skipped: device {index} gave no health figure")
    one = GpuSample(t=sample.t, available=True, devices=[dev])
    ctx = WatchContext(gpu=one)
    found = [
        *ecc_findings(ctx, every=True),
        *throttle_findings(ctx, every=True),
        *link_findings(ctx, every=True),
    ]
    h = dev.health
    figures = {
        "bus": dev.pci_bus_id,
        "temp_c": h.temp_c,
        "slowdown_c": h.temp_slowdown_c,
        "power_w": dev.power_w,
        "limit_w": h.power_limit_w,
        "default_w": h.power_default_limit_w,
        "ecc_vol_dbe": h.ecc_volatile_dbe,
        "ecc_agg_sbe": h.ecc_aggregate_sbe,
        "remap_pending": h.remap_pending,
        "retired_pending": h.retired_pending,
        "reasons": hex(h.clock_reasons) if h.clock_reasons is not None else None,
        "pcie": f"gen{h.pcie_gen}/{h.pcie_gen_max} x{h.pcie_width}/{h.pcie_width_max}",
        "notes": len(sample.notes),
    }
    if found:
        return _o("gpu_health", "fail", "; ".join(f"{f.code}: {f.message}" for f in found), **figures)
    return _o(
        "gpu_health",
        "pass",
        f"{dev.name}: no health finding (the keeper's rules on its real figures)",
        **figures,
    )


def check_kernel_log() -> dict[str, Any]:
    src = kernel_log_source()
    if src.startswith("unavailable"):  # the host's permissions, not the GPU: said, not failed
        return _o("kernel_log", "skip", f"skipped: a keeper could not read Xids here: {src}")
    return _o("kernel_log", "pass", f"a keeper reads Xids from {src}")


def check_xid_events(nvml: Any, index: int) -> dict[str, Any]:
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return _o("xid_events", "skip", f"skipped: {exc}")
    try:
        es = nvml.nvmlEventSetCreate()
        try:
            nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(index), XID_CRITICAL, es)
            try:
                nvml.nvmlEventSetWait(es, 100)
                said = "an event was pending"
            except nvml.NVMLError as exc:
                said = f"a 100 ms wait answered: {exc}"
            return _o("xid_events", "pass", f"critical-Xid events registered on device {index}; {said}")
        except nvml.NVMLError_NotSupported:
            return _o("xid_events", "skip", "skipped: critical-Xid events NotSupported on this device")
        finally:
            nvml.nvmlEventSetFree(es)
    except Exception as exc:
        return _o("xid_events", "fail", f"{type(exc).__name__}: {exc}")
    finally:
        nvml.nvmlShutdown()


def _smi_pl(index: int, watts: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nvidia-smi", "-i", str(index), "-pl", f"{watts:.0f}"], capture_output=True, text=True, timeout=30
    )


def check_power_cap(nvml: Any, index: int, python: str) -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return _o("power_cap", "skip", "skipped: no nvidia-smi")
    nvml.nvmlInit()
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        low_mw, _high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        was_w = nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        low_w = low_mw / 1000.0
        set_low = _smi_pl(index, low_w)
        if set_low.returncode != 0:
            said = (set_low.stderr or set_low.stdout).strip().splitlines()[-1:] or ["refused"]
            return _o("power_cap", "skip", f"skipped: `nvidia-smi -pl` is not allowed here: {said[0]}")
        seen: list[int] = []
        words: list[str] = []
        result: list[Any] = []
        during: GpuSample | None = None  # the last sample taken under the load
        try:
            t = threading.Thread(
                target=lambda: result.append(run_bench(f"cuda:{index}", python=python, seconds=8.0))
            )
            t.start()
            probe = GpuProbe(nvml)
            while t.is_alive():
                s = during = probe.sample()
                d = next((x for x in s.devices if x.index == index), None)
                if d is not None and d.health is not None and d.health.clock_reasons is not None:
                    seen.append(d.health.clock_reasons)
                    if (w := throttle_words(d)) is not None:
                        words.append(w)
                time.sleep(0.2)
            t.join()
            probe.close()
        finally:
            restored = _smi_pl(index, was_w)
        capped = any(r & SW_POWER_CAP for r in seen)
        bench = explain(result[0], during) if result else None
        ok = capped and any("power cap" in w for w in words) and restored.returncode == 0
        return _o(
            "power_cap",
            "pass" if ok else "fail",
            (words[-1] if words else "no throttle reason counted")
            + f"; limit {low_w:.0f} W (was {was_w:.0f} W, restored: {restored.returncode == 0})"
            + (f"; bench: {bench.message}" if bench is not None else ""),
            samples=len(seen),
            capped=sum(bool(r & SW_POWER_CAP) for r in seen),
            tflops=getattr(bench, "tflops", None),
        )
    finally:
        nvml.nvmlShutdown()


def health_checks(nvml: Any, index: int, python: str, cuda: bool) -> list[dict[str, Any]]:
    out = [check_kernel_log(), check_gpu_health(nvml, index), check_xid_events(nvml, index)]
    out.append(
        check_power_cap(nvml, index, python) if cuda else _o("power_cap", "skip", "skipped: no CUDA device")
    )
    return out
