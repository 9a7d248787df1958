"""The host: HOST_RAM_LOW (less RAM than a torch.load needs: ENOMEM under 3 GB free in scenario 13,
disguised as `SystemError: readinto`), STALE_LOCK (a lock file held by a process that is gone, a
zombie, or not the current attempt: relaunches abort on it, scenario 10) and DUPLICATE_TRAINER
(another trainer on the same command and directory, or two instances of a host process).

One HOST_RAM_LOW rule serves the watchdog (each probe cycle, against the configured floor) and
the checkpoint pipeline (before a load: the verifier's deferral and a resume)."""

from __future__ import annotations

import msgspec

from trainroom.core.findings import Finding, Target
from trainroom.core.health.context import WatchContext
from trainroom.core.run.state import RunState
from trainroom.core.samples import HostSample, LockHolder, LockInfo
from trainroom.core.units import errno_name, fmt_bytes

# --------------------------------------------------------------------------- HOST_RAM_LOW


def _where(host: HostSample | None, available: int) -> str:
    """What runs out: our cgroup (with its limit) when its figure is the smaller one, else the host."""
    cg = host.cgroup if host is not None else None
    if cg is not None and cg.limit_bytes and cg.available_bytes == available:
        return f"cgroup (limit {fmt_bytes(cg.limit_bytes)})"
    return "host"


def host_ram_low(
    available_bytes: int | None,
    need_bytes: int = 0,
    what: str = "",
    *,
    floor_bytes: int = 0,
    host: HostSample | None = None,
    enomem: bool = False,
) -> Finding | None:
    """HOST_RAM_LOW: less RAM available than max(need_bytes, floor_bytes).

    Two callers: the watchdog each probe cycle, with what the host (or our cgroup) can still give
    against `thresholds.host_ram_low_bytes` (no load: `what` empty); and a load of a checkpoint
    (`what` names it, `need_bytes` is what it needs: the verifier's deferral, a resume).
    Severity: critical when it blocks a load (the resume is refused until RAM is reclaimed) or
    the attempt already died of ENOMEM; a warning while it only says the trainer runs close to
    the edge.
    """
    need = max(need_bytes, floor_bytes)
    if available_bytes is None or available_bytes >= need:
        return None
    cache = host.page_cache_bytes if host is not None else None
    cg = host.cgroup if host is not None else None
    message = f"{_where(host, available_bytes)} RAM low: {fmt_bytes(available_bytes)} available"
    message += f", loading {what} needs {fmt_bytes(need)}" if what else f" (< {fmt_bytes(need)})"
    if cache is not None:
        message += f"; {fmt_bytes(cache)} in the page cache could be reclaimed"
    message += (
        "; reclaim the page cache (or stop other work) before resuming"
        if what
        else "; torch.load of a checkpoint fails with ENOMEM below this"
    )
    return Finding(
        code="HOST_RAM_LOW",
        severity="critical" if what or enomem else "warning",
        action="reclaim",
        key=what,
        message=message,
        evidence={
            "available_bytes": available_bytes,
            "threshold_bytes": need,
            "what": what or None,
            "page_cache_bytes": cache,
            "mem_total_bytes": host.mem_total_bytes if host is not None else None,
            "mem_available_bytes": host.mem_available_bytes if host is not None else None,
            "cgroup_limit_bytes": cg.limit_bytes if cg is not None else None,
            "cgroup_usage_bytes": cg.usage_bytes if cg is not None else None,
            "wsl": host.wsl if host is not None else None,
        },
    )


def host_ram_low_now(run: RunState, ctx: WatchContext) -> Finding | None:
    """The watchdog's HOST_RAM_LOW: the probe's effective available RAM against the floor."""
    host = ctx.host
    if host is None or not host.available:
        return None
    a = run.attempt
    enomem = (
        a is not None
        and a.crash is not None
        and any(errno_name(x.errno, x.errno_name) == "ENOMEM" for x in a.crash.chain)
    )
    return host_ram_low(
        host.effective_available_bytes,
        floor_bytes=ctx.thresholds.host_ram_low_bytes,
        host=host,
        enomem=enomem,
    )


# --------------------------------------------------------------------------- locks and duplicates


def stale_locks(run: RunState, ctx: WatchContext) -> list[Finding]:
    """STALE_LOCK: a configured lock whose holder is dead, a zombie, or not the current attempt."""
    a = run.attempt
    # Holders read before the attempt last started or ended describe the run as it was then (a
    # trainer that still held its own lock): wait for a cycle that postdates the change.
    if a is not None and ctx.probe_t is not None and ctx.probe_t < max(a.started_at, a.ended_at or 0.0):
        return []
    # Only a live attempt's processes may hold the lock; after a death every holder is stale.
    current: set[int] = set()
    if a is not None and a.alive and ctx.alive is not False:
        current = set(ctx.attempt_pids) | ({a.pid} if a.pid > 0 else set())
    out = []
    for lk in ctx.locks:
        for h in lk.holders:
            why = _stale_because(h, current)
            if why is not None:
                out.append(_stale_lock_finding(lk, h, why))
                break  # one finding per lock file
    return out


def _stale_because(h: LockHolder, current: set[int]) -> str | None:
    """Why a holder's lock is stale; None when it belongs to the live attempt."""
    if not h.exists:
        return f"pid {h.pid} no longer exists" if h.pid > 0 else "its owner is not visible here (pid 0)"
    if h.gone:
        return f"pid {h.pid} is a zombie"
    if h.pid in current:
        return None
    return f"pid {h.pid} ({h.comm}, state {h.state}) is not the current attempt"


def _stale_lock_finding(lk: LockInfo, h: LockHolder, why: str) -> Finding:
    inheritors = lk.inheritors
    inherit_txt = ""
    if inheritors:
        inherit_txt = "; still held through an inherited descriptor by " + ", ".join(
            f"pid {k.pid} ({k.comm}, state {k.state}, pgid {k.pgid})" for k in inheritors
        )
    kill_pids = [k.pid for k in inheritors if not k.gone] or (
        [h.pid] if h.exists and not h.gone and h.pid else []
    )
    holders = ", ".join(f"pid {pid}" for pid in kill_pids)
    target = Target(pids=kill_pids, label=f"{holders}, holding {lk.path}") if kill_pids else None
    return Finding(
        code="STALE_LOCK",
        severity="critical",
        action="kill" if target is not None else None,
        target=target,
        key=lk.path,
        message=f"{h.kind or 'lock'} on {lk.path} held by pid {h.pid}: {why}{inherit_txt}; "
        "a relaunch cannot take it",
        evidence={
            "path": lk.path,
            "lock_key": lk.key,
            "holder_pid": h.pid,
            "holder_state": h.state,
            "holder_exists": h.exists,
            "kind": h.kind,
            "mode": h.mode,
            "inheritors": [msgspec.to_builtins(k) for k in inheritors],
            "kill_pids": kill_pids,
            "kill_pgids": sorted({k.pgid for k in inheritors if k.pgid}),
            "waiters": lk.waiters,
        },
    )


def duplicate_findings(ctx: WatchContext) -> list[Finding]:
    out = []
    for d in ctx.duplicates:
        if d.kind == "host":
            # Which of two host processes is the stale one is the user's call: no key.
            out.append(
                Finding(
                    code="DUPLICATE_TRAINER",
                    severity="warning",
                    key=f"host:{d.name}",
                    message=(
                        f"{len(d.pids)} instances of {d.name} (pids {', '.join(map(str, d.pids))}): "
                        "a session that was not released holds its memory"
                    ),
                    evidence={"kind": "host", "name": d.name, "pids": d.pids, "others": d.others},
                )
            )
            continue
        if not d.others:
            continue
        mine = f"ours is pid {d.ours}" if d.ours else "our attempt is not running"
        others = ", ".join(f"pid {pid}" for pid in d.others)
        out.append(
            Finding(
                code="DUPLICATE_TRAINER",
                severity="warning",
                action="kill",
                target=Target(pids=list(d.others), label=f"{others}, the other trainer"),
                key="trainer",
                message=(
                    f"another process runs the same command in {d.cwd}: pid {', '.join(map(str, d.others))} "
                    f"({mine}); two trainers share the GPU and the checkpoint directory"
                ),
                evidence={
                    "kind": "trainer",
                    "pids": d.pids or d.others,
                    "ours": d.ours,
                    "others": d.others,
                    "cmdline": d.cmdline,
                    "cwd": d.cwd,
                },
            )
        )
    return out
