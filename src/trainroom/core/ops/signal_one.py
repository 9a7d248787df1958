"""Signal one process of the run (the processes table's kill): a choice of signal for exactly one
pid, proven the run's before anything is sent.

The plan proves the target as every kill does: the pid still names the process that was shown
(its start tick), it runs under the keeper's uid, it is neither the keeper, an ancestor of the
keeper, nor init, and it is the run's (`members.not_ours`: started within the live attempt and
TRAINROOM_RUN in its environment names this run). The execution opens a pidfd first and checks the
start tick again through it, so the signal reaches that process even if the pid is reused a
moment later; then it waits briefly for the effect the signal should have (gone, stopped,
running again) and reports the state before -> after.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import msgspec

from trainroom.core.ops.members import Lifetime, Member, describe, not_ours, process_of
from trainroom.core.ops.target_kill import protected_pids
from trainroom.core.probes.procs import read_stat, state_name

# The signals a person may choose, by name (nvitop's and htop's usual choice).
SIGNALS: dict[str, signal.Signals] = {
    "TERM": signal.SIGTERM,
    "INT": signal.SIGINT,
    "KILL": signal.SIGKILL,
    "USR1": signal.SIGUSR1,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
}
ENDS = frozenset({"TERM", "INT", "KILL"})  # what a process is expected to end on
EFFECT_WAIT_S = 3.0  # how long the result waits to see the signal's effect
POLL_S = 0.05


def signal_name(raw: str) -> str | None:
    """`STOP`, `sigstop`, `SIGSTOP` -> `STOP`; None when it is not one of SIGNALS."""
    name = raw.strip().upper().removeprefix("SIG")
    return name if name in SIGNALS else None


class SignalPlan(msgspec.Struct, kw_only=True):
    pid: int
    signal: str  # a key of SIGNALS
    start_ticks: int | None = None
    member: Member | None = None
    label: str = ""
    refusals: list[str] = []

    @property
    def ok(self) -> bool:
        return self.member is not None and not self.refusals

    def as_dict(self) -> dict[str, Any]:
        """As a kill plan reads (pgid 0, one member), plus the signal: the same confirmation."""
        m = self.member
        return {
            "pgid": 0,
            "signal": self.signal,
            "label": self.label,
            "members": [msgspec.to_builtins(m)] if m is not None else [],
            "refusals": list(self.refusals),
        }


def plan_signal(
    pid: int,
    sig: str,
    *,
    start_ticks: int | None,
    life: Lifetime,
    keeper_pid: int | None,
    label: str = "",
) -> SignalPlan:
    """The one process `sig` would reach, proven the run's, or the reasons to refuse."""
    plan = SignalPlan(pid=pid, signal=sig, start_ticks=start_ticks, label=label or f"pid {pid}")
    proc = process_of(pid)
    m = describe(proc, in_group=False) if proc is not None else None
    if m is None:
        plan.refusals.append(f"pid {pid} is gone (or a zombie): nothing to signal")
        return plan
    if start_ticks is not None and m.start_ticks is not None and m.start_ticks != start_ticks:
        plan.refusals.append(
            f"refusing pid {pid}: it started at tick {m.start_ticks}, not {start_ticks} (a reused pid)"
        )
        return plan
    try:
        uid = proc.uids().real if proc is not None else None
    except Exception:
        uid = None
    if uid != os.getuid():
        plan.refusals.append(f"refusing pid {pid}: it runs under uid {uid}, not {os.getuid()}")
        return plan
    if pid in protected_pids(keeper_pid):
        plan.refusals.append(f"refusing pid {pid}: it is the keeper, this process, init or their ancestor")
        return plan
    why = not_ours(m, life)
    if why is not None:
        plan.refusals.append(f"refusing pid {pid}: not proven this run's process ({why})")
        return plan
    plan.member = m
    plan.start_ticks = m.start_ticks
    return plan


def execute_signal(
    plan: SignalPlan, *, wait_s: float = EFFECT_WAIT_S
) -> tuple[bool, str, dict[str, Any], dict[str, Any]]:
    """Send the planned signal to the proven process: (ok, message, before, after)."""
    m = plan.member
    assert m is not None
    sig = SIGNALS[plan.signal]
    before = {"pid": m.pid, "state": _state(m.pid, m.start_ticks)}
    try:
        fd = os.pidfd_open(m.pid)
    except ProcessLookupError:
        return False, f"pid {m.pid} ended before it was signalled: nothing sent", before, before
    try:
        st = read_stat(m.pid)
        if st is None or (m.start_ticks is not None and st.start_ticks != m.start_ticks):
            return (
                False,
                f"pid {m.pid} no longer names the confirmed process: nothing sent",
                before,
                {"pid": m.pid, "state": "gone"},
            )
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False, f"pid {m.pid} ended before it was signalled: nothing sent", before, before
    finally:
        os.close(fd)
    after = _wait_effect(m, plan.signal, wait_s)
    words = f"sent SIG{plan.signal} to {plan.label}: {before['state']} -> {after['state']}"
    return True, words, before, after


def _expected(sig: str, state: str) -> bool:
    if sig in ENDS:
        return state == "gone"
    if sig == "STOP":
        return state in ("stopped", "tracing-stop", "gone")
    if sig == "CONT":
        return state not in ("stopped", "tracing-stop")
    return True  # USR1: whatever the process does with it


def _state(pid: int, ticks: int | None) -> str:
    st = read_stat(pid)
    if st is None or (ticks is not None and st.start_ticks != ticks) or st.state in ("Z", "X"):
        return "gone"
    return state_name(st.state)


def _wait_effect(m: Member, sig: str, wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    state = _state(m.pid, m.start_ticks)
    while not _expected(sig, state) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = _state(m.pid, m.start_ticks)
    out: dict[str, Any] = {"pid": m.pid, "state": state}
    if not _expected(sig, state):
        out["note"] = f"still {state} after {wait_s:g} s"
    return out
