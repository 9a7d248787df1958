"""`trainroom status --json`: a contract other tools script against. Keys are kept; more may be
added. A figure nobody measured is null, never invented."""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from trainroom.core.logs.loglines import unread_words
from trainroom.core.probes.procs import state_name
from trainroom.core.run.causes import Kind, Row, fold
from trainroom.core.run.figures import driver_view, pace, run_loss, step_age, vram
from trainroom.core.run.nowwords import now_findings
from trainroom.core.run.parts import WorkerView
from trainroom.core.run.state import RunState
from trainroom.core.samples import GpuSample
from trainroom.core.units import signal_name
from trainroom.core.vocab import ShownState
from trainroom.core.wire import protocol as p

NOTIFY_RECENT = 20


def _finite(x: float | None) -> float | str | None:
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _worker_state(w: WorkerView | None, letters: dict[int, str], keeper_alive: bool) -> str | None:
    """A rank process's state: the kernel's (running, sleeping, stopped, disk-sleep, ...) while
    it lives; once it ended `dead` (a signal, a non-zero exit), `exited` (0) or `gone` (how is not
    known); null when nothing was read of it."""
    if w is None:
        return None
    if w.ended_at is not None:
        if w.failed:
            return "dead"
        return "exited" if w.exit_code == 0 else "gone"
    letter = letters.get(w.pid)
    if letter is None or not keeper_alive:
        return None
    return state_name(letter)


def gpu_status(gpu: GpuSample | None) -> dict[str, Any]:
    """The driver's devices (bus id, lost, health), this attempt's Xids and the kernel log's source."""
    if gpu is None:
        return {"devices": [], "events": [], "kernel_log": None}
    return {
        "devices": [msgspec.to_builtins(d) for d in gpu.devices],
        "events": [msgspec.to_builtins(e) for e in gpu.events],
        "kernel_log": gpu.kernel_log or None,
    }


def journal_damage(st: RunState) -> dict[str, Any] | None:
    """What a read of the journal had to skip (a flipped byte, a torn tail), or None: the state
    shown is then everything the journal holds."""
    d = st.journal_damage
    if not (d.regions or d.unknown_records or d.torn_tail):
        return None
    return {
        "regions": d.regions,
        "skipped_bytes": d.skipped_bytes,
        "first_offset": d.first_offset,
        "unknown_records": d.unknown_records,
        "torn_tail": d.torn_tail,
    }


def damage_words(d: dict[str, Any]) -> str:
    """ "journal damaged: 37 bytes skipped in 1 place (from offset 4120); ..." """
    parts = []
    if d["regions"]:
        where = f" (from offset {d['first_offset']})" if d["first_offset"] is not None else ""
        parts.append(f"{d['skipped_bytes']} bytes skipped in {d['regions']} place(s){where}")
    if d["unknown_records"]:
        parts.append(f"{d['unknown_records']} record(s) of a newer trainroom skipped")
    if d["torn_tail"]:
        parts.append("the last write was cut short")
    return "journal damaged: " + "; ".join(parts) + "; every record around it was kept"


def rank_rows(st: RunState, keeper_alive: bool = True) -> list[dict[str, Any]]:
    """One row per rank: what its reporter (or the log) says, and its process (a torchrun
    worker, found through the process tree, or the pid its reporter gave): `rank, local_rank,
    pid, state, step, loss, step_time_s, tokens_per_s, connected, world_size, exit`."""
    a = st.attempt
    procs = st.probe.procs if st.probe is not None else None
    fresh = procs is not None and a is not None and procs.attempt == a.n and a.ended_at is None
    letters = dict(procs.states) if procs is not None and fresh else {}
    if procs is not None and fresh:
        letters.update({w.pid: w.state for w in procs.workers})
    by_rank: dict[int, WorkerView] = {}
    for seen in sorted(st.workers.values(), key=lambda x: (x.ended_at is None, x.seen_at)):
        by_rank[seen.rank] = seen  # a live process over an ended one, the newest over an older one
    rows = []
    for rank in sorted(set(st.ranks) | set(by_rank)):
        r, w = st.ranks.get(rank), by_rank.get(rank)
        pid = w.pid if w is not None else (r.pid if r is not None else None)
        state = _worker_state(w, letters, keeper_alive)
        if w is None and pid is not None and keeper_alive and pid in letters:
            state = state_name(letters[pid])
        rows.append(
            {
                "rank": rank,
                "local_rank": w.local_rank if w is not None else None,
                "pid": pid,
                "state": state,
                "step": r.step if r is not None else None,
                "loss": _finite(r.loss) if r is not None else None,
                "step_time_s": r.median_interval if r is not None else None,
                "tokens_per_s": r.tokens_per_s if r is not None else None,
                "connected": r.connected if r is not None else False,
                "disconnected_at": r.disconnected_at if r is not None else None,
                "world_size": (w.world_size if w is not None else None)
                or (r.world_size if r is not None else None),
                "exit": (
                    {
                        "code": w.exit_code,
                        "signal": w.exit_signal,
                        "signal_name": signal_name(w.exit_signal) if w.exit_signal is not None else None,
                    }
                    if w is not None and w.ended_at is not None
                    else None
                ),
            }
        )
    return rows


def _kind(k: Kind, text: str) -> dict[str, Any]:
    return {
        "code": k.code,
        "severity": k.severity,
        "count": k.count,
        "text": text,
        "latest": k.head.ident,
        "idents": [f.ident for f in k.findings],
    }


def finding_row(r: Row) -> dict[str, Any]:
    """One row of `run.causes.fold`: its root cause (the newest of its code leads, its action
    is the row's), then each consequence with its count since the cause."""
    return {
        **_kind(r.cause, r.cause.said()),
        "severity": r.severity,
        "action": r.head.action,
        "consequences": [_kind(k, r.consequence_line(k)) | {"since": r.since(k)} for k in r.consequences],
    }


def status_dict(st: RunState, now: float | None = None, keeper_alive: bool = True) -> dict[str, Any]:
    now = time.time() if now is None else now
    a = st.attempt
    age = step_age(st, now)
    rate, rate_source = pace(st)
    loss, worst_rank, worst_loss = run_loss(st)
    rank0 = st.ranks.get(0) or (next(iter(st.ranks.values())) if st.ranks else None)
    effective = rank0.lr if rank0 and rank0.lr else None
    v = vram(st)
    host = st.probe.host if st.probe is not None else None
    disk = st.probe.disk if st.probe is not None else None
    state: ShownState = st.status
    stepping = a is not None and a.ended_at is None and st.status not in ("stalled", "hung") and keeper_alive
    if not keeper_alive and a is not None and a.ended_at is None:
        state = "unknown"  # the keeper died before its trainer: nobody watched the end
    job = st.options.job
    # The words with the figures of now (`run.nowwords`): the gap, the ratio, the GiB measured last.
    found = now_findings(st.open_findings(), now if keeper_alive else None)
    rows = fold(found)
    cause_of = {f.ident: r.head.ident for r in rows for k in r.consequences for f in k.findings}
    return {
        "run": st.run_id,
        # The job this run is a node of (launch --job / torchrun's rendezvous id), or null.
        "job": msgspec.to_builtins(job) if job is not None else None,
        "state": state,
        "state_reason": st.status_reason or None,
        "keeper": "alive" if keeper_alive else "gone",
        "journal_damage": journal_damage(st),
        "attempt": a.n if a else None,
        "pid": a.pid if a else None,
        "pgid": a.pgid if a else None,
        # A process trainroom did not start, adopted by `trainroom attach` (its exit status unknown).
        "attached": a.attached if a else False,
        "argv": a.argv if a else st.argv,
        "exit": {
            "code": a.exit_code if a else None,
            "signal": a.exit_signal if a else None,
            "signal_name": signal_name(a.exit_signal) if a and a.exit_signal is not None else None,
        },
        "instrumented": a.instrumented if a else None,
        "step": st.current_step(),
        # The last step's age: as of now while the attempt lives, as of its end after (`ended_s_ago`
        # says how long ago that was).
        "step_age_s": round(age, 3) if age is not None else None,
        "ended_s_ago": round(now - a.ended_at, 3) if a is not None and a.ended_at is not None else None,
        # The pace now: null while no steps come (the attempt ended, or it is stalled or hung);
        # `steps_per_s_last` is the pace last seen, whatever the state.
        "steps_per_s": round(rate, 4) if rate and stepping else None,
        "steps_per_s_last": round(rate, 4) if rate else None,
        # Where the pace came from: `reporter`, the trainer's own timing on its log lines
        # (`iteration times`, `bar rate`, `timestamps`) or `read times` (when the lines were read).
        "steps_per_s_from": rate_source if rate else None,
        "loss": _finite(loss),
        "loss_worst": {"rank": worst_rank, "loss": _finite(worst_loss)} if worst_rank is not None else None,
        "lr": {"effective": effective, "requested": a.requested.lr if a else None},
        "vocab_size": a.requested.vocab_size if a else None,
        "vram": {
            "driver_available": v.available,
            "driver_reason": v.reason if st.probe is not None and st.probe.gpu is not None else None,
            "driver_used_bytes": v.used_bytes,
            "driver_total_bytes": v.total_bytes,
            "driver_run_bytes": v.run_bytes,
            # Added: what the run owns by the driver's view (per-process, else the device less
            # other live processes), over the allocator's reserve: GHOST_MEMORY's own figures.
            "driver_owned_bytes": v.owned_bytes,
            "driver_basis": v.basis,
            "driver_over_allocator": v.ratio,
            "allocator_allocated_bytes": v.allocated_bytes,
            "allocator_reserved_bytes": v.reserved_bytes,
        },
        # Added: each device's PCI bus id and health figures, the Xids seen this attempt, and
        # where the kernel's word on the GPU is read from (probes.gpuevents).
        "gpu": gpu_status(driver_view(st)),
        "host": {
            "mem_available_bytes": host.mem_available_bytes if host is not None else None,
            "page_cache_bytes": host.page_cache_bytes if host is not None else None,
            "mem_total_bytes": host.mem_total_bytes if host is not None else None,
        },
        "disk": {
            "path": disk.path if disk is not None else None,
            "used_fraction": disk.used_fraction if disk is not None else None,
            "free_bytes": disk.free_bytes if disk is not None else None,
            "time_to_full_s": disk.time_to_full_s if disk is not None else None,
            # Added: the figures above are a byte budget for the root (`--disk-budget`), not its
            # filesystem; the filesystem's own, said apart.
            "budget_bytes": disk.budget_bytes if disk is not None and disk.budget else None,
            "filesystem_used_fraction": (
                (disk.fs_used_fraction if disk.budget else disk.used_fraction) if disk is not None else None
            ),
            "filesystem_free_bytes": (
                (disk.fs_free_bytes if disk.budget else disk.free_bytes) if disk is not None else None
            ),
        },
        "ranks": rank_rows(st, keeper_alive),
        "checkpoints": [
            {
                "step": c.step,
                "path": c.path,
                "state": c.state,
                # What it holds of a faithful resume; null where its verification did not read it.
                "completeness": c.report.completeness.as_json()
                if c.report is not None and c.report.completeness is not None
                else None,
                "reason": c.reason,
                "size_bytes": c.size_bytes,
                "digest": c.digest,
                "promoted": c.report.promoted_file if c.report is not None else None,
                # The trainer's own evaluation before promotion ([eval]); null when not gated.
                "eval": _eval_dict(c.eval),
            }
            for c in st.checkpoints
        ],
        # The file a resume loads (`latest`, read by the keeper's disk probe; null without one).
        "latest_checkpoint": disk.latest if disk is not None else None,
        "findings": [
            {
                "code": f.code,
                "key": f.key,
                "ident": f.ident,
                "severity": f.severity,
                "message": f.message,
                "action": f.action,
                "target": msgspec.to_builtins(f.target) if f.target is not None else None,
                "first_seen": f.first_seen,
                "last_seen": f.last_seen,
                "evidence": f.evidence,
                # Added: the root cause it follows from (`vocab.FOLLOWS`), its ident; null: a root.
                "cause": cause_of.get(f.ident),
            }
            for f in found
        ],
        # Added: the open findings as every client shows them (`run.causes.fold`): each root
        # cause with what follows from it, one code's repeats one line with a count.
        "finding_rows": [finding_row(r) for r in rows],
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
        # Log-line telemetry: the recogniser that read the steps (hf, lightning, nanogpt, pattern).
        "log": {
            "recogniser": st.log_recogniser,
            # What `step` counts when log lines give it: optimizer steps, batches, logged dicts...
            "unit": st.log_unit,
            # Said when the log was read and nothing in it was recognised (pass --log-pattern).
            "unrecognised": unread_words(st.log_unread_lines) if st.log_unread_lines else None,
        },
        "resume": {"template": st.resume_template, "from": st.resume_template_from},
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


def _eval_dict(e: p.EvalFigure | None) -> dict[str, Any] | None:
    """A checkpoint's evaluation, every field named (null: not gated)."""
    if e is None:
        return None
    return {
        "figure": e.figure,
        "passed": e.passed,
        "why": e.why,
        "best": e.best,
        "seconds": e.seconds,
        "exit_code": e.exit_code,
        "command": e.command,  # what ran (`trainroom eval` reproduces with it)
        "pattern": e.pattern,
        "figure_name": e.figure_name,  # what the figure was printed as (`eval_loss`)
        "leftovers": e.leftovers,  # processes it left behind, killed when it ended
    }
