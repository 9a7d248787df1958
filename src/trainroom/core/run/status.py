"""`trainroom status --json`: a contract other tools script against. Keys are kept; more may be
added. A figure nobody measured is null, never invented."""

from __future__ import annotations

import math
import signal
import time
from typing import Any

from trainroom.core.run.state import RunState

NOTIFY_RECENT = 20


def _finite(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def driver_view(st: RunState) -> dict[str, Any]:
    """The driver's figures for the run: per-process where the driver reports it, else the device."""
    gpu = (st.probe.gpu if st.probe else {}) or {}
    out: dict[str, Any] = {
        "available": bool(gpu.get("available")),
        "reason": gpu.get("reason"),
        "used_bytes": None,
        "total_bytes": None,
        "run_bytes": None,
        "per_process": bool(gpu.get("per_process")),
    }
    devices = gpu.get("devices") or []
    if devices:
        used = [d.get("used_bytes") for d in devices if d.get("used_bytes") is not None]
        total = [d.get("total_bytes") for d in devices if d.get("total_bytes") is not None]
        out["used_bytes"] = sum(used) if used else None
        out["total_bytes"] = sum(total) if total else None
    ours = [pr.get("used_bytes") for pr in gpu.get("processes") or [] if pr.get("ours")]
    if out["per_process"] and ours and all(b is not None for b in ours):
        out["run_bytes"] = sum(ours)
    return out


def status_dict(st: RunState, now: float | None = None, keeper_alive: bool = True) -> dict[str, Any]:
    now = time.time() if now is None else now
    a = st.attempt
    last_t = st.last_step_t()
    interval = st.step_interval()
    loss, worst_rank, worst_loss = st.headline_loss()
    rank0 = st.ranks.get(0) or (next(iter(st.ranks.values())) if st.ranks else None)
    effective = rank0.lr if rank0 and rank0.lr else None
    alloc = [r for r in st.ranks.values() if r.alloc_reserved is not None]
    drv = driver_view(st)
    host = (st.probe.host if st.probe else {}) or {}
    disk = (st.probe.disk if st.probe else {}) or {}
    state = st.status
    if not keeper_alive and a is not None and a.ended_at is None:
        state = "unknown"  # the keeper died before its trainer: nobody watched the end
    return {
        "run": st.run_id,
        "state": state,
        "state_reason": st.status_reason or None,
        "keeper": "alive" if keeper_alive else "gone",
        "attempt": a.n if a else None,
        "pid": a.pid if a else None,
        "pgid": a.pgid if a else None,
        "argv": a.argv if a else st.argv,
        "exit": {
            "code": a.exit_code if a else None,
            "signal": a.exit_signal if a else None,
            "signal_name": signal_name(a.exit_signal) if a else None,
        },
        "instrumented": a.instrumented if a else None,
        "step": st.current_step(),
        "step_age_s": round(now - last_t, 3) if last_t is not None else None,
        "steps_per_s": round(1.0 / interval, 4) if interval else None,
        "loss": _finite(loss),
        "loss_worst": {"rank": worst_rank, "loss": _finite(worst_loss)} if worst_rank is not None else None,
        "lr": {"effective": effective, "requested": a.requested.lr if a else None},
        "vocab_size": a.requested.vocab_size if a else None,
        "vram": {
            "driver_available": drv["available"],
            "driver_reason": drv["reason"],
            "driver_used_bytes": drv["used_bytes"],
            "driver_total_bytes": drv["total_bytes"],
            "driver_run_bytes": drv["run_bytes"],
            "allocator_allocated_bytes": sum(r.alloc_allocated or 0 for r in alloc) if alloc else None,
            "allocator_reserved_bytes": sum(r.alloc_reserved or 0 for r in alloc) if alloc else None,
        },
        "host": {
            "mem_available_bytes": host.get("mem_available_bytes"),
            "page_cache_bytes": host.get("page_cache_bytes"),
            "mem_total_bytes": host.get("mem_total_bytes"),
        },
        "disk": {
            "path": disk.get("path"),
            "used_fraction": disk.get("used_fraction"),
            "free_bytes": disk.get("free_bytes"),
            "time_to_full_s": disk.get("time_to_full_s"),
        },
        "ranks": [
            {
                "rank": r.rank,
                "step": r.step,
                "loss": _finite(r.loss),
                "step_time_s": r.median_interval,
                "tokens_per_s": r.tokens_per_s,
                "connected": r.connected,
            }
            for r in sorted(st.ranks.values(), key=lambda r: r.rank)
        ],
        "checkpoints": [
            {
                "step": c.step,
                "path": c.path,
                "state": c.state,
                "reason": c.reason,
                "size_bytes": c.size_bytes,
                "digest": c.digest,
                "promoted": (c.report or {}).get("promoted_file"),
            }
            for c in st.checkpoints
        ],
        # The file a resume loads (`latest`, read by the keeper's disk probe; null without one).
        "latest_checkpoint": disk.get("latest"),
        "findings": [
            {
                "code": f.code,
                "severity": f.severity,
                "message": f.message,
                "action": f.action,
                "first_seen": f.first_seen,
                "last_seen": f.last_seen,
                "evidence": f.evidence,
            }
            for f in st.open_findings()
        ],
        "attempts": [
            {
                "n": x.n,
                "pid": x.pid,
                "started_at": x.started_at,
                "ended_at": x.ended_at,
                "exit_code": x.exit_code,
                "exit_signal": x.exit_signal,
                "first_step": x.first_step,
                "last_step": x.last_step,
                "resume_from": x.resume_from,
            }
            for x in st.attempts
        ],
        "steps_total": st.steps_total,
        # Alerts the keeper sent (core/notify): outcome counts, and the last deliveries, newest
        # last. Channel names are redacted; a target's secret never appears here.
        "notify": {
            "outcomes": dict(st.notify_outcomes),
            "recent": [
                {
                    "t": n.t,
                    "channel": n.channel,
                    "kind": n.kind,
                    "alert": n.alert,
                    "severity": n.severity or None,
                    "outcome": n.outcome,
                    "try": n.try_n,
                    "detail": n.detail or None,
                    "latency_s": n.latency_s,
                }
                for n in st.notifications[-NOTIFY_RECENT:]
            ],
        },
    }
