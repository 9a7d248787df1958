"""The GPU: GHOST_MEMORY (the driver holds far more for the run than its allocator reserves:
memory left by earlier crashed contexts, or WSL2 keeping a dead context's memory until the VM
restarts) and ORPHAN_CONTEXT (a context that outlived its process: a driver pid that is gone, or
a device busy with no live process of ours). Both need the condition to hold for a few probe
cycles (`Memory` counts them), so one odd sample is not a finding."""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.run.figures import VramFigures, vram_figures
from trainroom.core.run.state import RunState
from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample
from trainroom.core.units import fmt_bytes


def ghost_measure(run: RunState, ctx: WatchContext) -> VramFigures | None:
    """The run's VRAM figures (`run.figures.vram_figures`: what the driver attributes to the run
    against what its allocator reserves) while the attempt lives and both sides are known."""
    a = run.attempt
    if ctx.gpu is None or not ctx.gpu.available or a is None or not a.alive or ctx.alive is False:
        return None
    v = vram_figures(ctx.gpu, run.ranks.values())
    if v.owned_bytes is None or v.ratio is None or not v.reserved_bytes or v.reserved_bytes <= 0:
        return None
    return v


def ghost_seen(v: VramFigures | None, ctx: WatchContext) -> bool:
    """One probe cycle's GHOST_MEMORY condition: over the factor, and by more than a context's cost."""
    th = ctx.thresholds
    if v is None or v.ratio is None or v.owned_bytes is None or v.reserved_bytes is None:
        return False
    return v.ratio > th.ghost_factor and v.owned_bytes - v.reserved_bytes >= th.ghost_min_excess_bytes


def ghost_finding(v: VramFigures | None, streak: int, run: RunState, ctx: WatchContext) -> Finding | None:
    th = ctx.thresholds
    if v is None or streak < th.ghost_cycles or v.ratio is None:
        return None
    wsl = ctx.host is not None and ctx.host.wsl
    basis = (
        "the driver attributes"
        if v.basis == "per-process"
        else "the device shows (per-process memory is N/A here, device totals stand in)"
    )
    if wsl:
        advice = (
            "under WSL2 the driver keeps dead contexts' memory until the VM restarts: "
            "stop the run, `wsl --shutdown` from Windows, resume"
        )
        action = None
    else:
        advice = "memory left by earlier crashed contexts: kill leftover processes of earlier attempts, then resume"
        action = "kill"
    previous = [x.pgid for x in run.attempts[:-1] if x.pgid > 0]
    return Finding(
        code="GHOST_MEMORY",
        severity="warning",
        action=action,
        message=(
            f"{basis} {fmt_bytes(v.owned_bytes)} but the allocator reserves {fmt_bytes(v.reserved_bytes)} "
            f"({v.ratio:.2f}x > {th.ghost_factor}x for {streak} probe cycles): {advice}"
        ),
        evidence={
            "driver_bytes": v.owned_bytes,
            "reserved_bytes": v.reserved_bytes,
            "ratio": round(v.ratio, 3),
            "basis": v.basis,
            "devices": v.devices,
            "factor": th.ghost_factor,
            "cycles": streak,
            "wsl": wsl,
            "previous_pgids": previous,
        },
    )


def _ours_computing(run: RunState, ctx: WatchContext, gpu: GpuSample) -> bool:
    a = run.attempt
    if a is None or not a.alive or ctx.alive is False:
        return False
    if gpu.ours:
        return True
    if any(r.alloc_reserved for r in run.ranks.values()):
        return True  # the allocator holds memory: our trainer computes
    # No process list (WSL often gives none) or PIDs from another namespace: the busy device may
    # well be our own live trainer warming up, so it is not called an orphan.
    return not gpu.processes or gpu.pid_namespace != "host"


def busy_devices(run: RunState, ctx: WatchContext) -> list[GpuDevice]:
    """Devices at >= orphan_util_percent with no live compute process of ours and none that exists
    in our namespace: something dead is computing (the "100 % at 60 W, [Not Found]" wedge)."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available or _ours_computing(run, ctx, gpu):
        return []
    return [
        d
        for d in gpu.devices
        if d.util_percent is not None
        and d.util_percent >= ctx.thresholds.orphan_util_percent
        and not any(x.device == d.index and not x.gone for x in gpu.processes)
    ]


def orphan_candidates(ctx: WatchContext) -> list[GpuProcess]:
    """Compute processes the driver lists whose pid does not exist here or is a zombie. Only in the
    host PID namespace: elsewhere the driver's (host) PIDs need not exist here at all."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available or gpu.pid_namespace != "host":
        return []
    return [x for x in gpu.processes if x.gone]


def _device(gpu: GpuSample, index: int) -> GpuDevice:
    return next((d for d in gpu.devices if d.index == index), GpuDevice(index=index))


def orphan_findings(run: RunState, ctx: WatchContext, mem: Memory) -> list[Finding]:
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    found: list[Finding] = []
    previous = [x.pgid for x in run.attempts if x.pgid > 0 and x.ended_at is not None]
    for x in orphan_candidates(ctx):
        if mem.orphan_streak.get(x.pid, 0) < ctx.thresholds.orphan_cycles:
            continue  # a context being torn down right after its process exited
        what = "does not exist" if not x.exists else "is a zombie"
        dev = _device(gpu, x.device)
        found.append(
            Finding(
                code="ORPHAN_CONTEXT",
                severity="critical",
                action="kill",
                key=f"pid-{x.pid}",
                message=(
                    f"the driver lists compute pid {x.pid} holding {fmt_bytes(x.used_bytes)} on "
                    f"device {x.device}, and that pid {what}: a context that outlived its process"
                    + (
                        f" (device at {dev.util_percent} %, {dev.power_w} W)"
                        if dev.util_percent is not None
                        else ""
                    )
                    + "; kill the old process group and confirm the VRAM falls"
                ),
                evidence={
                    "pid": x.pid,
                    "used_bytes": x.used_bytes,
                    "device": x.device,
                    "exists": x.exists,
                    "state": x.state,
                    "device_used_bytes": dev.used_bytes,
                    "util_percent": dev.util_percent,
                    "power_w": dev.power_w,
                    "previous_pgids": previous,
                },
            )
        )
    for d in busy_devices(run, ctx):
        streak = mem.busy_streak.get(d.index, 0)
        if streak < ctx.thresholds.orphan_cycles:
            continue
        found.append(
            Finding(
                code="ORPHAN_CONTEXT",
                severity="critical",
                action="kill",
                key=f"device-{d.index}",
                message=(
                    f"device {d.index} is {d.util_percent} % busy at {d.power_w} W with "
                    f"{fmt_bytes(d.used_bytes)} used, and no live compute process of ours: a zombie "
                    "context holds the GPU; kill the old process group and confirm the VRAM falls"
                ),
                evidence={
                    "device": d.index,
                    "util_percent": d.util_percent,
                    "power_w": d.power_w,
                    "used_bytes": d.used_bytes,
                    "total_bytes": d.total_bytes,
                    "cycles": streak,
                    "driver_pids": [x.pid for x in gpu.processes if x.device == d.index],
                    "previous_pgids": previous,
                },
            )
        )
    return found
