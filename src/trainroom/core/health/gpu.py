"""The GPU: GHOST_MEMORY (the driver holds far more for the run than its allocator reserves:
memory left by earlier crashed contexts, or WSL2 keeping a dead context's memory until the VM
restarts) and ORPHAN_CONTEXT (a context that outlived its process: a driver pid that is gone, or
a device busy with no live process of ours). Both need the condition to hold for a few probe
cycles (`Memory` counts them), so one odd sample is not a finding."""

from __future__ import annotations

from trainroom.core.findings import Finding, Target
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


# What usually makes memory of the run that its allocator cannot see: a process besides the
# ranks that touched CUDA and so made a context of its own.
GHOST_CAUSE = (
    "usually a DataLoader worker or an async-save child that touched CUDA and made its own context "
    "(about 500-740 MiB each on current drivers, before any tensor)"
)


def rank_pids(run: RunState, ctx: WatchContext) -> set[int]:
    """The attempt's trainer processes: its leader, the ranks' reporters and the rank workers."""
    a = run.attempt
    return (
        {r.pid for r in run.ranks.values() if r.pid}
        | {w.pid for w in ctx.workers}
        | ({a.pid} if a is not None and a.pid > 0 else set())
    )


def allocatorless(run: RunState, ctx: WatchContext, v: VramFigures) -> list[GpuProcess]:
    """The run's live processes the driver lists holding memory that report no allocator: where
    the driver gives per-process rows, these explain memory the allocators cannot see."""
    gpu = ctx.gpu
    if gpu is None or v.basis != "per-process":
        return []
    reporting = {r.pid for r in run.ranks.values() if r.pid and r.alloc_reserved is not None}
    if not reporting:
        return []  # no rank says which process its figures are: nothing to tell apart
    return [x for x in gpu.ours if x.used_bytes and x.pid not in reporting and not x.gone]


def _named(x: GpuProcess, ranks: set[int]) -> str:
    cmd = " ".join(x.cmdline)
    cmd = cmd if len(cmd) <= 100 else cmd[:99] + "…"
    what = "a rank" if x.pid in ranks else "not a rank"
    return f"pid {x.pid} ({cmd or 'command line unknown'}; {what}) holds {fmt_bytes(x.used_bytes)}"


def _holders_target(holders: list[GpuProcess], ranks: set[int]) -> Target | None:
    xs = [x for x in holders if x.pid not in ranks]
    if not xs:
        return None
    pids = ", ".join(f"pid {x.pid}" for x in xs)
    return Target(
        pids=[x.pid for x in xs],
        start_ticks=[x.start_ticks for x in xs],
        label=f"{pids}, a process of the run holding VRAM with no allocator",
    )


def _unexplained_advice(ctx: WatchContext, wsl: bool) -> tuple[str, Target | None]:
    """The advice for memory no live process of the run explains, and the kill it offers."""
    if wsl:
        return (
            "under WSL2 the driver keeps dead contexts' memory until the VM restarts: "
            "stop the run, `wsl --shutdown` from Windows, resume"
        ), None
    target = leftover_target(ctx)
    if target is not None:
        return (
            f"memory left by earlier attempts: kill what is left of them ({target.label}), then resume",
            target,
        )
    return (
        "no process of an earlier attempt is alive, so nothing of ours holds it: contexts the driver "
        "has not released (stop the run; `nvidia-smi --gpu-reset` or a reboot frees them)"
    ), None


def ghost_finding(v: VramFigures | None, streak: int, run: RunState, ctx: WatchContext) -> Finding | None:
    th = ctx.thresholds
    if v is None or streak < th.ghost_cycles or v.ratio is None or v.owned_bytes is None:
        return None
    wsl = ctx.host is not None and ctx.host.wsl
    basis = (
        "the driver attributes"
        if v.basis == "per-process"
        else "the device shows (per-process memory is N/A here, device totals stand in)"
    )
    ranks = rank_pids(run, ctx)
    holders = allocatorless(run, ctx, v)
    held = sum(x.used_bytes or 0 for x in holders)
    rest = v.owned_bytes - held  # what no live process of the run without an allocator explains
    reserved = v.reserved_bytes or 0
    rest_is_ghost = not holders or (
        reserved > 0 and rest / reserved > th.ghost_factor and rest - reserved >= th.ghost_min_excess_bytes
    )
    parts: list[str] = []
    target = _holders_target(holders, ranks)
    if holders:
        names = "; ".join(_named(x, ranks) for x in holders)
        kill = f"; kill {', '.join(f'pid {p}' for p in target.pids)} (k)" if target is not None else ""
        parts.append(f"{names}, reporting no allocator: {GHOST_CAUSE}{kill} or keep CUDA out of that process")
    if rest_is_ghost:
        advice, leftovers = _unexplained_advice(ctx, wsl)
        if holders:
            advice = f"{fmt_bytes(rest)} more that no process of the run explains: {advice}"
        parts.append(advice)
        target = target or leftovers
    previous = [x.pgid for x in run.attempts[:-1] if x.pgid > 0]
    return Finding(
        code="GHOST_MEMORY",
        severity="warning",
        action="kill" if target is not None else None,
        target=target,
        message=(
            f"{basis} {fmt_bytes(v.owned_bytes)} but the allocator reserves {fmt_bytes(v.reserved_bytes)} "
            f"({v.ratio:.2f}x > {th.ghost_factor}x for {streak} probe cycles): {'; '.join(parts)}"
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
            # The run's processes holding memory with no allocator (per-process rows only).
            "holders": [
                {"pid": x.pid, "cmdline": x.cmdline, "used_bytes": x.used_bytes, "rank": x.pid in ranks}
                for x in holders
            ],
            "unexplained_bytes": rest if rest_is_ghost else 0,
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
    """Compute processes the driver lists whose pid does not exist here or is a zombie, or is a
    leftover of this run (alive, but of no live attempt: a straggler keeping its context). Only
    in the host PID namespace: elsewhere the driver's (host) PIDs need not exist here at all."""
    gpu = ctx.gpu
    if gpu is None or not gpu.available or gpu.pid_namespace != "host":
        return []
    left = {x.pid for x in ctx.leftovers}
    return [x for x in gpu.processes if x.gone or x.pid in left]


def leftover_target(ctx: WatchContext, pids: set[int] | None = None) -> Target | None:
    """This run's leftovers (all, or those among `pids`) as a kill target, named; None: none."""
    xs = [x for x in ctx.leftovers if pids is None or x.pid in pids]
    if not xs:
        return None
    what = ", ".join(f"pid {x.pid}" for x in xs[:4]) + (f" and {len(xs) - 4} more" if len(xs) > 4 else "")
    attempts = sorted({x.attempt for x in xs if x.attempt is not None})
    whence = (
        f"left from attempt{'s' if len(attempts) > 1 else ''} {', '.join(map(str, attempts))}"
        if attempts
        else "left from an earlier attempt"
    )
    return Target(
        pids=[x.pid for x in xs], start_ticks=[x.start_ticks for x in xs], label=f"{what}, {whence}"
    )


def _device(gpu: GpuSample, index: int) -> GpuDevice:
    return next((d for d in gpu.devices if d.index == index), GpuDevice(index=index))


def orphan_findings(run: RunState, ctx: WatchContext, mem: Memory) -> list[Finding]:
    gpu = ctx.gpu
    if gpu is None or not gpu.available:
        return []
    found: list[Finding] = []
    previous = [x.pgid for x in run.attempts if x.pgid > 0 and x.ended_at is not None]
    anyone = leftover_target(ctx)
    for x in orphan_candidates(ctx):
        if mem.orphan_streak.get(x.pid, 0) < ctx.thresholds.orphan_cycles:
            continue  # a context being torn down right after its process exited
        found.append(_orphan_pid_finding(x, _device(gpu, x.device), ctx, previous, anyone))
    for d in busy_devices(run, ctx):
        streak = mem.busy_streak.get(d.index, 0)
        if streak < ctx.thresholds.orphan_cycles:
            continue
        found.append(
            Finding(
                code="ORPHAN_CONTEXT",
                severity="critical",
                action="kill" if anyone is not None else None,
                target=anyone,
                key=f"device-{d.index}",
                message=(
                    f"device {d.index} is {d.util_percent} % busy at {d.power_w} W with "
                    f"{_used_of(d)} used, and no live compute process of ours: a zombie "
                    f"context holds the GPU; {_remedy(anyone, d.index)}"
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


def _used_of(d: GpuDevice) -> str:
    """ "11.3 GiB of 12.0 GiB": what is in use with what the device has, when the driver says."""
    return (
        f"{fmt_bytes(d.used_bytes)} of {fmt_bytes(d.total_bytes)}"
        if d.total_bytes
        else fmt_bytes(d.used_bytes)
    )


def _remedy(target: Target | None, device: int) -> str:
    if target is not None:
        return f"kill {target.label} and confirm the VRAM falls"
    return (
        "nothing of this run is alive to kill: the driver keeps a dead context "
        f"(`nvidia-smi --gpu-reset -i {device}` with the device idle, or a reboot)"
    )


def _orphan_pid_finding(
    x: GpuProcess, dev: GpuDevice, ctx: WatchContext, previous: list[int], anyone: Target | None
) -> Finding:
    """ORPHAN_CONTEXT for one driver-listed pid: gone or a zombie (its memory is the driver's to
    release; leftovers of the run may hold it), or a live leftover of an ended attempt (kill it)."""
    busy = f" (device at {dev.util_percent} %, {dev.power_w} W)" if dev.util_percent is not None else ""
    held = f"the driver lists compute pid {x.pid} holding {fmt_bytes(x.used_bytes)} on device {x.device}"
    if x.gone:
        what = "does not exist" if not x.exists else "is a zombie"
        target = anyone
        message = f"{held}, and that pid {what}: a context that outlived its process{busy}; {_remedy(target, x.device)}"
    else:
        target = leftover_target(ctx, {x.pid})
        left = next((y for y in ctx.leftovers if y.pid == x.pid), None)
        whence = (
            f"attempt {left.attempt}"
            if left is not None and left.attempt is not None
            else "an earlier attempt"
        )
        state = f", {left.state}" if left is not None and left.state else ""
        message = (
            f"{held}: pid {x.pid}{state} is a process of {whence}, which ended, keeping its context{busy}; "
            f"{_remedy(target, x.device)}"
        )
    return Finding(
        code="ORPHAN_CONTEXT",
        severity="critical",
        action="kill" if target is not None else None,
        target=target,
        key=f"pid-{x.pid}",
        message=message,
        evidence={
            "pid": x.pid,
            "used_bytes": x.used_bytes,
            "device": x.device,
            "exists": x.exists,
            "state": x.state,
            "leftover": not x.gone,
            "device_used_bytes": dev.used_bytes,
            "util_percent": dev.util_percent,
            "power_w": dev.power_w,
            "previous_pgids": previous,
        },
    )
