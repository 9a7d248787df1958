"""`continue`: SIGCONT the attempt's stopped processes (state T, as after a SIGSTOP or a Ctrl-Z
that reached the group), each proven the run's, and confirm they run again. HUNG by a stop says
so; this is its remedy once the stacks are dumped."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence

import msgspec
import psutil

from trainroom.core.ops.members import Lifetime, Member, group_members, not_ours, process_of, recorded_workers

STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
CONFIRM_S = 5.0


class WakePlan(msgspec.Struct, kw_only=True):
    pgid: int
    stopped: list[Member] = []
    refusals: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.refusals


class WakeResult(msgspec.Struct, kw_only=True):
    ok: bool
    message: str
    woken: list[int] = []
    still_stopped: list[int] = []


def plan_wake(pgid: int, life: Lifetime, workers: Sequence[tuple[int, int]] = ()) -> WakePlan:
    """The stopped processes of the attempt's group, and of its recorded rank processes
    (`workers`: pid and start tick; torchrun's live in sessions of their own)."""
    plan = WakePlan(pgid=pgid)
    if pgid <= 1:
        plan.refusals.append(f"refusing pgid {pgid}: a group <= 1 is the whole system or init")
        return plan
    found = group_members(pgid)
    found += recorded_workers(workers, {m.pid for m in found})
    plan.stopped = [m for m in found if m.state in STOPPED and not_ours(m, life) is None]
    if not plan.stopped:
        plan.refusals.append(f"nothing is stopped in process group {pgid}")
    return plan


def execute_wake(plan: WakePlan) -> WakeResult:
    handles = {m.pid: h for m in plan.stopped if (h := process_of(m.pid)) is not None}
    for h in handles.values():
        try:
            h.send_signal(signal.SIGCONT)  # psutil checks the create time: never a reused pid
        except psutil.Error:
            continue
    deadline = time.monotonic() + CONFIRM_S
    while True:
        still = [pid for pid, h in handles.items() if _stopped(h)]
        if not still or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    woken = sorted(set(handles) - set(still))
    if still:
        return WakeResult(
            ok=False, message=f"SIGCONT sent; still stopped: {still}", woken=woken, still_stopped=still
        )
    return WakeResult(ok=True, message=f"SIGCONT: {len(woken)} process(es) run again: {woken}", woken=woken)


def _stopped(h: psutil.Process) -> bool:
    try:
        return h.status() in STOPPED
    except psutil.Error:
        return False
