"""`trainroom doctor`: what this host allows a run and what it lacks, as one typed Report.

The GPU's side is read the way the keeper reads it: NVML through `probes.gpu.GpuProbe` (the same
init, the versioned process calls, per-process N/A), plus the driver version and persistence mode;
CUDA through the trainer's own interpreter (`python -c`, since the keeper never imports torch).
The host's side is `ops.host_checks`.

What "needed" means: a check is `missing` only when the configured run cannot do without it; the
report is `ok` (exit 0) when nothing is missing. Every run needs its state dir, a config `launch`
accepts, and a writable checkpoint root with room for a save. A run that uses a GPU also needs NVML
and CUDA in the trainer's torch; it uses one when told (`--gpu`), or, unless told otherwise
(`--cpu`), when the driver or the trainer's torch sees a device. So a CPU-only host is degraded,
not missing.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from trainroom.core.configuration.config import Config
from trainroom.core.configuration.settings import HostRoots, LaunchOptions, checkpoint_root
from trainroom.core.ops import host_checks as hc
from trainroom.core.ops.gpu_checks import check_gpu_health
from trainroom.core.ops.host_checks import Check, Fact, absent
from trainroom.core.probes import fake_nvml
from trainroom.core.probes.gpu import PROCESS_FUNCTIONS, GpuProbe
from trainroom.core.probes.host import is_wsl
from trainroom.core.samples import GpuSample
from trainroom.core.units import fmt_bytes

GpuChoice = Literal["auto", "gpu", "cpu"]
ProcessApi = Literal["v3", "v2", "v1"]
TORCH_TIMEOUT_S = 120.0
_UNAVAILABLE = "driver view unavailable: "

# Run in the trainer's interpreter: what its torch sees. Prints one JSON line.
_TORCH_PROBE = """
import json, sys
try:
    import torch
except Exception as exc:
    print(json.dumps({"importable": False, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
out = {"importable": True, "version": str(torch.__version__), "cuda_build": torch.version.cuda}
try:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out.update(cuda_available=n > 0, device_count=n, devices=[torch.cuda.get_device_name(i) for i in range(n)])
except Exception as exc:
    out.update(cuda_available=False, error=f"{type(exc).__name__}: {exc}")
print(json.dumps(out))
"""


class GpuDevice(msgspec.Struct, kw_only=True):
    index: int
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    persistence_mode: bool | None  # None: the driver does not say (WSL, Windows)


class ProcessCall(msgspec.Struct, kw_only=True):
    """One nvmlDeviceGetComputeRunningProcesses variant, called."""

    version: ProcessApi
    ok: bool
    said: str  # "ok: 2 process(es) in 0.41 ms", "not in this driver (FunctionNotFound)", "error: ..."


class NvmlView(msgspec.Struct, kw_only=True):
    available: bool
    fake: bool = False  # the fake at the pynvml boundary stands in ($TRAINROOM_FAKE_NVML), as for the keeper
    reason: str = ""  # why not, as NVML says it ("NVML Shared Library Not Found")
    driver_version: str | None = None
    devices: list[GpuDevice] = []
    per_process: bool | None = None  # None: no compute process now to tell
    processes: int = 0
    notes: list[str] = []
    process_calls: list[ProcessCall] = []  # on device 0, newest first
    probe_cycle_ms: float | None = None  # the median of a few GpuProbe samples
    sample: GpuSample | None = None  # the probe's own sample: the health figures gpu_health judges

    @property
    def process_api(self) -> ProcessApi | None:
        """The newest process call that answers: the one the keeper's probe settles on."""
        return next((c.version for c in self.process_calls if c.ok), None)


class TorchView(msgspec.Struct, kw_only=True):
    python: str
    importable: bool = False
    error: str | None = None
    version: str | None = None
    cuda_build: str | None = None  # torch.version.cuda; None: a CPU build
    cuda_available: bool = False
    device_count: int = 0
    devices: list[str] = []


class DoctorOptions(msgspec.Struct, kw_only=True, frozen=True):
    project_dir: str
    state_dir: str
    python: str  # the trainer's interpreter
    gpu: GpuChoice = "auto"
    ckpt_root: str | None = None  # as `launch --ckpt-root` would give it
    roots: HostRoots = msgspec.field(default_factory=HostRoots)


class Report(msgspec.Struct, kw_only=True):
    ok: bool  # nothing the run needs is missing: exit code 0
    gpu_needed: bool
    gpu_needed_why: str
    project_dir: str
    state_dir: str
    python: str
    ckpt_root: str | None
    checks: list[Check]
    devices: list[GpuDevice] = []

    @property
    def missing(self) -> list[Check]:
        return [c for c in self.checks if c.status == "missing"]

    def as_dict(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        assert isinstance(out, dict)
        return out


# --------------------------------------------------------------------------- observations


def nvml_view(nvml: Any = None, *, proc_root: str = "/proc") -> NvmlView:
    """The driver as the keeper's probe sees it, plus its version and each device's persistence
    mode; `nvml` is pynvml or the fake (default: what the keeper would load)."""
    probe = GpuProbe(nvml, proc_root=proc_root)
    lib = probe.nvml
    fake = isinstance(lib, fake_nvml.FakeNvml)
    try:
        sample = probe.sample()
        if not sample.available:
            return NvmlView(available=False, fake=fake, reason=sample.reason.removeprefix(_UNAVAILABLE))
        devices = [
            GpuDevice(
                index=d.index,
                name=d.name,
                total_bytes=d.total_bytes,
                used_bytes=d.used_bytes,
                persistence_mode=_persistence(lib, d.index),
            )
            for d in sample.devices
        ]
        try:
            calls = process_call_ladder(lib, 0) if devices else []
        except Exception:  # device 0 went away between the sample and now
            calls = []
        cycles, _ = probe_cycles(probe, 5)
        return NvmlView(
            available=True,
            fake=fake,
            driver_version=_driver_version(lib),
            devices=devices,
            per_process=sample.per_process,
            processes=len(sample.processes),
            notes=list(sample.notes),
            process_calls=calls,
            probe_cycle_ms=round(statistics.median(cycles), 3),
            sample=sample,
        )
    finally:
        probe.close()


def process_call_ladder(nvml: Any, index: int = 0) -> list[ProcessCall]:
    """Each ComputeRunningProcesses variant on device `index`, newest first: the ladder the
    keeper's probe walks down (v3 -> v2 -> v1) until one answers, since the struct changed across
    drivers. NVML must be initialised; a bad index raises the binding's NVMLError."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    return [_call_processes(nvml, name, handle) for name in PROCESS_FUNCTIONS]


def _call_processes(nvml: Any, name: str, handle: Any) -> ProcessCall:
    version: ProcessApi = "v3" if name.endswith("_v3") else "v2" if name.endswith("_v2") else "v1"
    fn = getattr(nvml, name, None)
    if fn is None:
        return ProcessCall(version=version, ok=False, said="absent from this nvidia-ml-py")
    t0 = time.perf_counter()
    try:
        rows = list(fn(handle))
    except nvml.NVMLError_FunctionNotFound:
        return ProcessCall(version=version, ok=False, said="not in this driver (FunctionNotFound)")
    except nvml.NVMLError as exc:
        return ProcessCall(version=version, ok=False, said=f"error: {exc}")
    except Exception as exc:  # the binding's own struct-version mismatch
        return ProcessCall(version=version, ok=False, said=f"error: {type(exc).__name__}: {exc}")
    ms = (time.perf_counter() - t0) * 1000
    return ProcessCall(version=version, ok=True, said=f"ok: {len(rows)} process(es) in {ms:.2f} ms")


def probe_cycles(probe: GpuProbe, cycles: int) -> tuple[list[float], GpuSample | None]:
    """The wall time in ms of each of `cycles` samples of an initialised probe (the NVML calls the
    keeper makes once a second), and the last sample."""
    times: list[float] = []
    sample: GpuSample | None = None
    for _ in range(cycles):
        t0 = time.perf_counter()
        sample = probe.sample(our_pids=[os.getpid()])
        times.append((time.perf_counter() - t0) * 1000)
    return times, sample


def _driver_version(lib: Any) -> str | None:
    try:
        v = lib.nvmlSystemGetDriverVersion()
    except Exception:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _persistence(lib: Any, index: int) -> bool | None:
    fn = getattr(lib, "nvmlDeviceGetPersistenceMode", None)
    if fn is None:
        return None
    try:
        return int(fn(lib.nvmlDeviceGetHandleByIndex(index))) == 1  # NVML_FEATURE_ENABLED
    except Exception:  # NotSupported under WSL and on Windows: the driver does not say
        return None


def torch_view(python: str, timeout_s: float = TORCH_TIMEOUT_S) -> TorchView:
    """What torch in `python` (the trainer's interpreter) sees; never raises."""
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return TorchView(python=python, error=f"importing torch took over {timeout_s:g} s")
    except OSError as exc:
        return TorchView(python=python, error=f"cannot run {python}: {exc.strerror or exc}")
    lines = done.stdout.strip().splitlines()
    try:
        found = msgspec.json.decode(lines[-1], type=dict[str, Any])
        return msgspec.convert({**found, "python": python}, TorchView)
    except (IndexError, msgspec.DecodeError, msgspec.ValidationError):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return TorchView(python=python, error=f"{python} could not say what torch sees: {tail}")


def gpu_need(choice: GpuChoice, nvml: NvmlView, torch: TorchView) -> tuple[bool, str]:
    """Whether the run uses a GPU, and why we think so."""
    if choice == "gpu":
        return True, "told so (--gpu)"
    if choice == "cpu":
        return False, "told so (--cpu)"
    if nvml.devices:
        return True, f"the driver shows {len(nvml.devices)} device(s)"
    if torch.cuda_available:
        return True, f"the trainer's torch sees {torch.device_count} CUDA device(s)"
    return False, "neither the driver nor the trainer's torch sees a GPU"


# --------------------------------------------------------------------------- GPU checks


def check_nvml(view: NvmlView, needed: bool, wsl: bool) -> Check:
    facts: dict[str, Fact] = {
        "available": view.available,
        "driver_version": view.driver_version,
        "devices": len(view.devices),
        "per_process": view.per_process,
        "process_api": view.process_api,
        "probe_cycle_ms": view.probe_cycle_ms,
        "fake": view.fake,
    }
    source = f"fake NVML (${fake_nvml.ENV}): " if view.fake else ""
    if not view.available:
        driver = (
            "the NVIDIA Windows driver (WSL uses it; no Linux driver inside WSL)"
            if wsl
            else "the NVIDIA driver"
        )
        return Check(
            name="nvml",
            status=absent(needed),
            needed=needed,
            facts=facts,
            detail=source + (view.reason or "NVML unavailable"),
            fix=f"install {driver} so `nvidia-smi` works"
            if needed
            else f"nothing for a CPU run; with an NVIDIA GPU, install {driver} so `nvidia-smi` works "
            "(without it the VRAM panel has no driver view and GHOST_MEMORY / ORPHAN_CONTEXT cannot fire)",
        )
    if not view.devices:
        return Check(
            name="nvml",
            status=absent(needed),
            needed=needed,
            facts=facts,
            detail=f"{source}NVML works (driver {view.driver_version}) but shows no device",
            fix="check CUDA_VISIBLE_DEVICES, the container's --gpus, and `nvidia-smi -L`",
        )
    shown = "; ".join(_device_line(d) for d in view.devices)
    calls = (
        view.process_api
        or "none answers (" + "; ".join(f"{c.version} {c.said}" for c in view.process_calls) + ")"
    )
    detail = (
        f"{source}driver {view.driver_version}; {shown}; per-process memory: {_per_process_text(view, wsl)}; "
        f"process call: {calls}; one probe cycle {view.probe_cycle_ms} ms"
    )
    fixes = []
    if view.process_api is None:
        fixes.append(
            "update nvidia-ml-py (pip install -U nvidia-ml-py) to match the driver: no process list, no per-process memory"
        )
    if any(d.persistence_mode is False for d in view.devices):
        fixes.append(
            "`sudo nvidia-smi -pm 1` (or enable nvidia-persistenced): without it each start re-initialises the driver"
        )
    if view.per_process is False or (view.per_process is None and wsl):
        fixes.append(
            "nothing to fix under WSL2/WDDM or MIG: ghost memory is judged from device totals, "
            "so keep other GPU work off the run's device"
        )
    return Check(
        name="nvml",
        status="degraded" if fixes else "ok",
        needed=needed,
        facts=facts,
        detail=detail,
        fix="; ".join(fixes),
    )


def _device_line(d: GpuDevice) -> str:
    persistence = {True: "persistence on", False: "persistence off", None: "persistence n/a"}[
        d.persistence_mode
    ]
    return (
        f"#{d.index} {d.name or 'unnamed'} {fmt_bytes(d.total_bytes)} "
        f"({fmt_bytes(d.used_bytes)} used), {persistence}"
    )


def _per_process_text(view: NvmlView, wsl: bool) -> str:
    if view.per_process is True:
        return f"reported ({view.processes} compute process(es) now)"
    if view.per_process is False:
        return "N/A from this driver (WSL2/WDDM or MIG): device totals stand in"
    if wsl:
        return "N/A under WSL2/WDDM (no compute process now to show it)"
    return "not shown now (no compute process); bare-metal drivers report it"


def check_cuda(view: TorchView, needed: bool) -> Check:
    facts: dict[str, Fact] = {
        "python": view.python,
        "torch": view.version,
        "cuda_build": view.cuda_build,
        "cuda_available": view.cuda_available,
        "devices": view.device_count,
    }
    if not view.importable:
        return Check(
            name="cuda",
            status=absent(needed),
            needed=needed,
            facts=facts,
            detail=f"torch is not importable by {view.python}: {view.error or 'unknown error'}; checkpoint "
            "verification and the bench need it",
            fix="install torch in the trainer's environment, or name its interpreter with --python",
        )
    if view.cuda_available:
        names = ", ".join(view.devices)
        return Check(
            name="cuda",
            status="ok",
            needed=needed,
            facts=facts,
            detail=f"torch {view.version} (CUDA {view.cuda_build}) in {view.python} sees {view.device_count} "
            f"device(s): {names}",
        )
    if view.cuda_build is None:
        why = f"torch {view.version} in {view.python} is a CPU build"
        fix = "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"
    else:
        why = f"torch {view.version} (CUDA {view.cuda_build}) in {view.python} sees no device" + (
            f": {view.error}" if view.error else ""
        )
        fix = "check the driver (`nvidia-smi`), CUDA_VISIBLE_DEVICES and that the driver is new enough for this CUDA"
    return Check(
        name="cuda",
        status=absent(needed),
        needed=needed,
        facts=facts,
        detail=why,
        fix=fix if needed else f"nothing for a CPU run; for a GPU run: {fix}",
    )


# --------------------------------------------------------------------------- the report


def run_doctor(options: DoctorOptions, *, nvml: Any = None, sudo: hc.SudoProbe = hc.sudo_refusal) -> Report:
    """Every check, in the order a user reads them. Blocking (torch's import in a subprocess)."""
    project, state = Path(options.project_dir), Path(options.state_dir)
    roots = options.roots
    state_check = hc.check_state_dir(state)
    config_check, config = hc.check_config(project, state)
    config = config or Config()
    root = checkpoint_root(
        LaunchOptions(ckpt_root=options.ckpt_root),
        config.resolved(project),
        cwd=str(project),
        run_dir=state / "runs" / "<run>",
        env=os.environ,
    )
    wsl = is_wsl(roots.proc)
    nv = nvml_view(nvml, proc_root=roots.proc)
    torch = torch_view(options.python)
    needed, why = gpu_need(options.gpu, nv, torch)
    checks = [
        state_check,
        config_check,
        check_nvml(nv, needed, wsl),
        check_cuda(torch, needed),
        check_gpu_health(nv.sample),
        hc.check_wsl(roots.proc),
        hc.check_ckpt_fs(root, os.path.join(roots.proc, "mounts")),
        hc.check_disk(root, config.thresholds),
        hc.check_host_ram(roots.proc, roots.cgroup, config.thresholds),
        hc.check_reclaim(roots.cgroup, roots.proc, sudo),
        hc.check_stacks(roots.proc),
        hc.check_ssh(),
    ]
    return Report(
        ok=not any(c.status == "missing" for c in checks),
        gpu_needed=needed,
        gpu_needed_why=why,
        project_dir=str(project),
        state_dir=str(state),
        python=options.python,
        ckpt_root=str(root),
        checks=checks,
        devices=nv.devices,
    )


def render(report: Report) -> list[str]:
    """The report for a human: one line per check (`name  status: detail`), its fix under it."""
    uses = "uses a GPU" if report.gpu_needed else "does not need a GPU"
    lines = [
        f"trainroom doctor: project {report.project_dir}, state dir {report.state_dir}, "
        f"trainer python {report.python}",
        f"the run {uses}: {report.gpu_needed_why}",
        "",
    ]
    width = max(len(c.name) for c in report.checks)
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.status}: {c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<{width}}  fix: {c.fix}")
    lines.append("")
    missing = report.missing
    if missing:
        lines.append(f"missing what the run needs: {', '.join(c.name for c in missing)} (exit 1)")
    else:
        degraded = [c.name for c in report.checks if c.status == "degraded"]
        tail = f"; degraded: {', '.join(degraded)}" if degraded else ""
        lines.append(f"nothing the run needs is missing (exit 0){tail}")
    return lines
