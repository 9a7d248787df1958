"""A targeted kill: the processes a finding names (`Finding.target`: a second trainer on the same
command, the holder of a stale lock, leftovers of earlier attempts that hold GPU memory), not the
run's own trainer.

The plan proves each target before anything is signalled, as the trainer's kill does: the pid
still names the process the finding saw (its start tick), it runs under the keeper's uid, it is
neither the keeper, an ancestor of the keeper, init, nor the run's live trainer. Its descendants
(started after it, same uid) go with it. The plan is a `KillPlan` with no group (pgid 0), so the
same confirmation (pids and start ticks) and the same `execute_kill` (SIGTERM, grace, SIGKILL,
confirm gone, VRAM) apply.
"""

from __future__ import annotations

import os

import psutil

from trainroom.core.findings import Target
from trainroom.core.ops.kill import KillPlan
from trainroom.core.ops.members import Member, Stranger, describe, process_of
from trainroom.core.probes.procs import started_since


def protected_pids(keeper_pid: int | None) -> set[int]:
    """Never a target: init, this process, the keeper and every ancestor of either."""
    out = {1, os.getpid()}
    for pid in (os.getpid(), keeper_pid):
        proc = process_of(pid) if pid else None
        if proc is None:
            continue
        out.add(proc.pid)
        try:
            out |= {a.pid for a in proc.parents()}
        except psutil.Error:
            pass
    return out


def _uid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def _descendants(root: Member, seen: set[int], uid: int) -> list[Member]:
    proc = process_of(root.pid)
    if proc is None:
        return []
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        m = describe(child, in_group=False) if child.pid not in seen else None
        if m is None or _uid(m.pid) != uid:
            continue
        if started_since(m.create_time, m.start_ticks, root.create_time, root.start_ticks):
            seen.add(m.pid)
            out.append(m)
    return out


def plan_target_kill(
    target: Target, *, keeper_pid: int | None, run_id: str, live_trainer: set[int] | None = None
) -> KillPlan:
    """The exact processes a kill of `target` signals, each proven (see the module docstring), or
    the reasons to refuse. Gone targets are no refusal: with none left, the plan is `nothing_left`
    (the kill then only confirms the driver released their memory)."""
    plan = KillPlan(pgid=0, leader_pid=0, leader_start_time=0.0, run_id=run_id, label=target.label)
    uid = os.getuid()
    protected = protected_pids(keeper_pid)
    seen: set[int] = set()
    members: list[Member] = []
    for pid, ticks in target.processes():
        proc = process_of(pid)
        m = describe(proc, in_group=False) if proc is not None else None
        if m is None:
            continue  # gone, or a zombie: it holds nothing any more
        if ticks is not None and m.start_ticks is not None and m.start_ticks != ticks:
            plan.strangers.append(
                Stranger(
                    pid=pid,
                    cmdline=m.cmdline,
                    why=f"pid reused: it started at tick {m.start_ticks}, not {ticks}",
                )
            )
            continue
        if _uid(pid) != uid:
            plan.strangers.append(
                Stranger(pid=pid, cmdline=m.cmdline, why=f"it runs under uid {_uid(pid)}, not {uid}")
            )
            continue
        if pid in protected:
            plan.refusals.append(
                f"refusing pid {pid}: it is the keeper, this process, init or their ancestor"
            )
            continue
        if live_trainer and pid in live_trainer:
            plan.refusals.append(
                f"refusing pid {pid}: it is this run's live trainer (kill without a finding stops the trainer)"
            )
            continue
        seen.add(pid)
        members.append(m)
        members += [d for d in _descendants(m, seen, uid) if d.pid not in protected]
    plan.members = sorted(members, key=lambda m: m.pid)
    if not plan.members and not plan.refusals and plan.strangers:
        why = "; ".join(f"pid {x.pid}: {x.why}" for x in plan.strangers)
        plan.refusals.append(
            f"refusing {target.label or 'the target'}: no process of it is proven killable ({why})"
        )
    if not plan.members and not plan.refusals:
        plan.empty = True
        plan.refusals.append(f"nothing left to kill: {target.label or 'the target'} is gone")
    return plan
