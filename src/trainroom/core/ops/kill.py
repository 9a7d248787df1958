"""Kill an attempt's process group and confirm it is gone, down to the driver's memory.

Two steps, so a client can show the exact target before anything is signalled:

- `plan_kill` names the target: the attempt's PGID, every live member (pid, cmdline, state), and
  the leader's descendants that left the group (dataloader workers or async-save children that
  called setsid). It refuses a PGID <= 1, our own group, the keeper's, a leader whose create
  time no longer matches the attempt's (PID reuse), or a group with nothing in it.
- `execute_kill` sends SIGTERM to the group, waits the grace, SIGKILLs what is left, confirms
  every member is gone (a zombie counts as gone: it holds no memory, only a slot in the process
  table until its parent reaps it), then polls the driver's view of the run's VRAM until it is
  under the tolerance (scenario 10: 12 GB -> 400 MiB) or the timeout passes. That view says what the
  run holds on a basis (ops/vram.py: per-process rows, the floor recorded at launch, or the
  device's used memory), and the result names the basis it judged on.

Both return Structs; `as_dict()` gives the JSON-able form for Reply and ActionRecord.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import psutil

# Identity is (pid, start): the start's clock tick where recorded (exact), else psutil's create
# time within a tolerance (probes.procs.same_start).
from trainroom.core.ops.members import (
    Lifetime,
    Member,
    Stranger,
    describe,
    group_members,
    not_ours,
    pgid_of,
    process_of,
    recorded_workers,
)
from trainroom.core.ops.vram import Progress, VramProbe, VramReading, read_reading, released_words, wait_vram
from trainroom.core.probes.host import read_meminfo
from trainroom.core.probes.procs import same_start, started_since
from trainroom.core.probes.procs import start_ticks as _ticks_of
from trainroom.core.units import fmt_bytes, fmt_clock

# How long to wait, after SIGKILL, for the kernel to tear the processes down (a process in
# uninterruptible sleep inside a driver call dies only when that call returns).
KILL_CONFIRM_S = 5.0
POLL_S = 0.1


class KillPlan(msgspec.Struct, kw_only=True):
    pgid: int
    leader_pid: int
    leader_start_time: float
    leader_start_ticks: int | None = None
    # The run whose processes these are (their environment carries TRAINROOM_RUN) and the end of
    # the attempt (None: still running): a process started after it is nobody's leftover.
    run_id: str = ""
    attempt_ended_at: float | None = None
    attached: bool = False  # an adopted attempt (members.Lifetime.attached)
    members: list[Member] = []
    strangers: list[Stranger] = []
    refusals: list[str] = []
    # The group has no live member left (the attempt died whole, e.g. SIGKILLed): a refusal to
    # signal, but not an error for a caller whose aim is "nothing of that attempt is left".
    empty: bool = False
    # A targeted kill (a finding's Target: a duplicate trainer, a lock holder, leftovers of
    # earlier attempts) has no group (pgid 0): its members are signalled one by one, and this
    # names them in words.
    label: str = ""

    @property
    def subject(self) -> str:
        return self.label or f"pgid {self.pgid}"

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def life(self) -> Lifetime:
        return Lifetime(
            run_id=self.run_id,
            start_time=self.leader_start_time,
            start_ticks=self.leader_start_ticks,
            ended_at=self.attempt_ended_at,
            attached=self.attached,
        )

    @property
    def nothing_left(self) -> bool:
        """Refused only because nothing of the attempt is alive: what remains to confirm is the
        driver's memory (a context can outlive its process)."""
        return self.empty and len(self.refusals) == 1

    def as_dict(self) -> dict[str, Any]:
        return _builtins(self) | {"ok": self.ok, "nothing_left": self.nothing_left}


class KillResult(msgspec.Struct, kw_only=True):
    ok: bool
    message: str
    pgid: int
    signals: list[str] = []  # "SIGTERM -> pgid 123", "SIGKILL -> pid 456"
    survivors: list[Member] = []  # still alive at the end (none when ok)
    vram_released: bool | None = None  # None: the driver view was unavailable
    # How the release was judged (ops/vram.py): "per-process", "floor" or "device"; None: no view.
    vram_basis: str | None = None
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return _builtins(self)


def _builtins(x: msgspec.Struct) -> dict[str, Any]:
    out = msgspec.to_builtins(x)
    assert isinstance(out, dict)
    return out


# --------------------------------------------------------------------------- plan


def plan_kill(
    attempt_pid: int,
    attempt_pgid: int,
    attempt_start_time: float,
    *,
    attempt_start_ticks: int | None = None,
    keeper_pid: int | None = None,
    run_id: str,
    attempt_ended_at: float | None = None,
    workers: Sequence[tuple[int, int]] = (),
    attached: bool = False,
) -> KillPlan:
    """The exact target of a kill of this attempt, or the reasons to refuse it. A process is a
    target only when proven the run's: started within the attempt's lifetime and carrying the
    run's id in its environment (the keeper puts TRAINROOM_RUN there; children inherit it).
    `workers` are the (pid, start tick) of the rank processes the keeper recorded: torchrun's
    workers live in sessions of their own, and outlive a torchrun killed by SIGKILL."""
    plan = KillPlan(
        pgid=attempt_pgid,
        leader_pid=attempt_pid,
        leader_start_time=attempt_start_time,
        leader_start_ticks=attempt_start_ticks,
        run_id=run_id,
        attempt_ended_at=attempt_ended_at,
        attached=attached,
    )
    if attempt_pgid <= 1:
        plan.refusals.append(f"refusing pgid {attempt_pgid}: a group <= 1 is the whole system or init")
        return plan
    plan.refusals += _group_refusals(attempt_pgid, keeper_pid)
    leader, reused = _leader(attempt_pid, attempt_start_time, attempt_start_ticks)
    if reused is not None:
        plan.refusals.append(reused)
        return plan
    members = list(group_members(attempt_pgid))
    # A member older than the attempt cannot be part of it: the group number was reused.
    older = [
        m
        for m in members
        if not started_since(m.create_time, m.start_ticks, attempt_start_time, attempt_start_ticks)
    ]
    if older:
        plan.refusals.append(
            f"refusing pgid {attempt_pgid}: pid {older[0].pid} in it started at {_clock(older[0].create_time)}, "
            f"before the attempt ({_clock(attempt_start_time)}): the group number was reused"
        )
    # Descendants of the leader and of every member, wherever their group is now.
    roots = ([leader] if leader is not None else []) + [p for p in (process_of(m.pid) for m in members) if p]
    seen = {m.pid for m in members}
    members += _strayed_descendants(roots, seen, attempt_start_time, attempt_start_ticks)
    members += recorded_workers(workers, seen)
    if leader is not None and leader.pid not in seen:
        # An adopted trainer that does not lead its group (started by a script): itself, not the group.
        found = describe(leader, in_group=False)
        members += [found] if found is not None else []
    proven = []
    for m in members:
        why = not_ours(m, plan.life)
        if why is None:
            proven.append(m)
        elif not older or m not in older:
            plan.strangers.append(Stranger(pid=m.pid, cmdline=m.cmdline, why=why))
    members = proven
    protected = {os.getpid()} | ({keeper_pid} if keeper_pid is not None else set())
    hit = sorted(protected & {m.pid for m in members})
    if hit:
        plan.refusals.append(f"refusing pgid {attempt_pgid}: it contains pid {hit[0]}, ours or the keeper's")
    plan.members = sorted(members, key=lambda m: (not m.in_group, m.pid))
    if not plan.members and not plan.refusals:
        plan.empty = True
        plan.refusals.append(f"no such process group: pgid {attempt_pgid} has no live members of this run")
    return plan


def _group_refusals(pgid: int, keeper_pid: int | None) -> list[str]:
    out = []
    if pgid == os.getpgid(0):
        out.append(f"refusing pgid {pgid}: it is our own process group")
    if keeper_pid is not None and pgid_of(keeper_pid) == pgid:
        out.append(f"refusing pgid {pgid}: it is the keeper's process group (keeper pid {keeper_pid})")
    return out


def _leader(pid: int, start_time: float, ticks: int | None) -> tuple[psutil.Process | None, str | None]:
    """The attempt's leader if it still lives (None when gone), and a refusal when its pid now
    names another process."""
    leader = process_of(pid)
    if leader is None:
        return None, None
    try:
        created = leader.create_time()
        same = same_start(pid, start_time, ticks)
    except psutil.Error:
        return None, None
    if same is None:
        return None, None
    if same:
        return leader, None
    now_ticks = _ticks_of(pid)
    at = f" (tick {now_ticks}, the attempt's {ticks})" if ticks is not None and now_ticks is not None else ""
    return None, (
        f"refusing pid {pid}: it started at {_clock(created)}, the attempt's at "
        f"{_clock(start_time)}{at} (the PID was reused)"
    )


def _strayed_descendants(
    roots: list[psutil.Process], seen: set[int], start_time: float, ticks: int | None
) -> list[Member]:
    """Descendants of the roots that left the group (setsid, a torchrun worker), started no
    earlier than the attempt."""
    out: list[Member] = []
    for root in roots:
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            if child.pid in seen:
                continue
            member = describe(child, in_group=False)
            if member is not None and started_since(
                member.create_time, member.start_ticks, start_time, ticks
            ):
                seen.add(child.pid)
                out.append(member)
    return out


# --------------------------------------------------------------------------- execute


def execute_kill(
    plan: KillPlan,
    grace_s: float = 10.0,
    vram_probe: VramProbe | None = None,
    tolerance_bytes: int = 512 << 20,
    vram_timeout_s: float = 50.0,
    progress: Progress | None = None,
    *,
    vram_poll_s: float = 2.0,
    proc_root: str = "/proc",
    stop: threading.Event | None = None,
) -> KillResult:
    """SIGTERM the group, SIGKILL what outlives the grace, confirm it is gone and the VRAM freed.

    Blocking (up to grace + a few seconds + vram_timeout_s): run it in a worker thread, with
    `progress` posting each line to the requesting client. `stop` set ends the wait for the
    VRAM (a client's cancel), never the signalling: a kill is not cut off half-way.
    """
    say = progress or (lambda _line: None)
    if plan.nothing_left:
        return _confirm_nothing_left(
            plan, vram_probe, tolerance_bytes, vram_timeout_s, vram_poll_s, say, proc_root, stop
        )
    if not plan.ok:
        return KillResult(ok=False, message="; ".join(plan.refusals), pgid=plan.pgid)

    targets = _handles(plan)
    first = read_reading(vram_probe)
    vram_before = first.bytes if first is not None else None
    before = {
        "members": len(targets),
        "pids": sorted(targets),
        "vram_bytes": vram_before,
        "mem_available_bytes": _mem_available(proc_root),
    }
    signals: list[str] = []

    alive = _alive(targets)
    if alive:
        _signal_all(plan, targets, signal.SIGTERM, signals)
        say(f"SIGTERM sent to {plan.subject} ({len(alive)} live)")
        alive = _wait_gone(targets, plan, grace_s)
    if alive:
        say(f"{len(alive)} still alive after the {grace_s:g} s grace: SIGKILL")
        # Members forked during the grace are in the group too: pick them up before SIGKILL.
        _adopt_new_members(plan, targets)
        _signal_all(plan, targets, signal.SIGKILL, signals)
        alive = _wait_gone(targets, plan, KILL_CONFIRM_S)

    survivors = [m for m in (describe(p, in_group=True) for p in alive) if m is not None]
    after: dict[str, Any] = {"members": len(survivors), "pids": [m.pid for m in survivors]}
    if survivors:
        states = ", ".join(f"{m.pid} ({m.state})" for m in survivors)
        now = read_reading(vram_probe)
        after |= {
            "vram_bytes": now.bytes if now is not None else None,
            "mem_available_bytes": _mem_available(proc_root),
        }
        return KillResult(
            ok=False,
            message=f"{len(survivors)} of {len(targets)} processes survived SIGKILL: {states}",
            pgid=plan.pgid,
            signals=signals,
            survivors=survivors,
            before=before,
            after=after,
        )
    say(f"all {len(targets)} processes of {plan.subject} are gone")
    return _confirm_release(
        plan,
        f"{len(targets)} processes of {plan.subject} gone",
        vram_probe,
        (tolerance_bytes, vram_timeout_s, vram_poll_s),
        say,
        proc_root,
        before=before,
        signals=signals,
        stop=stop,
    )


def _confirm_nothing_left(
    plan: KillPlan,
    vram_probe: VramProbe | None,
    tolerance_bytes: int,
    vram_timeout_s: float,
    vram_poll_s: float,
    say: Progress,
    proc_root: str,
    stop: threading.Event | None,
) -> KillResult:
    """Nothing to signal: the group is empty. Still confirm what a kill confirms, that the
    driver gave the memory back (a context that outlived its process still holds it)."""
    first = read_reading(vram_probe)
    before = {
        "members": 0,
        "pids": [],
        "vram_bytes": first.bytes if first is not None else None,
        "mem_available_bytes": _mem_available(proc_root),
    }
    say(f"nothing left to signal: {plan.subject} has no live members")
    return _confirm_release(
        plan,
        f"nothing left to kill: {plan.subject} has no live members",
        vram_probe,
        (tolerance_bytes, vram_timeout_s, vram_poll_s),
        say,
        proc_root,
        before=before,
        signals=[],
        stop=stop,
    )


def _confirm_release(
    plan: KillPlan,
    gone: str,
    vram_probe: VramProbe | None,
    wait: tuple[int, float, float],
    say: Progress,
    proc_root: str,
    *,
    before: dict[str, Any],
    signals: list[str],
    stop: threading.Event | None = None,
) -> KillResult:
    """Wait for the driver to give the run's memory back; the result says on what basis."""
    tolerance_bytes, vram_timeout_s, vram_poll_s = wait
    released, reading, waited = wait_vram(
        vram_probe, before["vram_bytes"], tolerance_bytes, vram_timeout_s, vram_poll_s, say, stop
    )
    cancelled = released is False and stop is not None and stop.is_set()
    after: dict[str, Any] = {
        "members": 0,
        "pids": [],
        "vram_bytes": reading.bytes if reading is not None else None,
        "mem_available_bytes": _mem_available(proc_root),
        "vram_wait_s": round(waited, 1),
    } | _basis_figures(reading)
    vram_before = before["vram_bytes"]
    if released is None or reading is None:
        message = f"{gone}; driver view unavailable, VRAM release not confirmed"
    elif cancelled:
        message = (
            f"cancelled the wait for VRAM after {waited:.0f} s: {gone}, but the driver still "
            f"holds {_size(reading.bytes)} for the run (release not confirmed)"
        )
        after["vram_wait_cancelled"] = True
    elif released:
        message = (
            f"{gone}; VRAM {_size(vram_before)} -> {_size(reading.bytes)}: released, "
            f"judged {released_words(reading)}"
        )
    else:
        message = (
            f"{gone}; but the driver still holds {_size(reading.bytes)} for the run after "
            f"{vram_timeout_s:g} s (tolerance {_size(tolerance_bytes)}), judged {released_words(reading)}"
        )
    return KillResult(
        ok=released is not False,
        message=message,
        pgid=plan.pgid,
        signals=signals,
        vram_released=released,
        vram_basis=reading.basis if reading is not None else None,
        before=before,
        after=after,
    )


def _basis_figures(reading: VramReading | None) -> dict[str, Any]:
    if reading is None:
        return {}
    return {
        "vram_basis": reading.basis,
        "vram_device_bytes": reading.device_bytes,
        "vram_floor_bytes": reading.floor_bytes,
    }


def _handles(plan: KillPlan) -> dict[int, psutil.Process]:
    """psutil handles for the planned members whose create time still matches (not reused)."""
    handles: dict[int, psutil.Process] = {}
    for m in plan.members:
        proc = process_of(m.pid)
        if proc is None:
            continue
        try:
            if same_start(m.pid, m.create_time, m.start_ticks):
                handles[m.pid] = proc
        except psutil.Error:
            continue
    return handles


def _is_gone(proc: psutil.Process) -> bool:
    try:
        # is_running() also compares create time, so a reused PID reads as gone.
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True
    except psutil.AccessDenied:
        return False


def _alive(targets: dict[int, psutil.Process]) -> list[psutil.Process]:
    return [p for p in targets.values() if not _is_gone(p)]


def _group_is_ours(plan: KillPlan) -> bool:
    """Whether one killpg may reach the group: only while its leader lives and is the attempt's.
    A leaderless group can hold anyone by now (a daemon that double-forked into it, a stranger
    that reused the number), so then each proven member is signalled on its own."""
    if plan.pgid <= 1:
        return False  # a targeted kill: no group, each member on its own
    try:
        return same_start(plan.pgid, plan.leader_start_time, plan.leader_start_ticks) is True
    except psutil.Error:
        return False


def _livegroup_members(plan: KillPlan) -> list[psutil.Process]:
    """Members of the group now (one forked during the grace), each proven the run's."""
    found: list[psutil.Process] = []
    if plan.pgid <= 1:
        return found
    for m in group_members(plan.pgid):
        if not_ours(m, plan.life) is None:
            proc = process_of(m.pid)
            if proc is not None:
                found.append(proc)
    return found


def _wait_gone(targets: dict[int, psutil.Process], plan: KillPlan, timeout_s: float) -> list[psutil.Process]:
    """Poll until every target and every current member of the group is gone, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in _livegroup_members(plan):
            targets.setdefault(proc.pid, proc)
        alive = _alive(targets)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def _adopt_new_members(plan: KillPlan, targets: dict[int, psutil.Process]) -> None:
    for proc in _livegroup_members(plan):
        targets.setdefault(proc.pid, proc)


def _signal_all(
    plan: KillPlan, targets: dict[int, psutil.Process], sig: signal.Signals, log: list[str]
) -> None:
    name = signal.Signals(sig).name
    grouped = False
    if _group_is_ours(plan):
        try:
            # One killpg reaches the members atomically, including any forked a moment ago.
            os.killpg(plan.pgid, sig)
            grouped = True
            log.append(f"{name} -> pgid {plan.pgid}")
        except ProcessLookupError:
            pass
    for pid, proc in targets.items():
        in_group = pgid_of(pid) == plan.pgid
        if grouped and in_group:
            continue
        try:
            proc.send_signal(sig)  # checks the create time first: never a reused PID
            log.append(f"{name} -> pid {pid}")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        except psutil.AccessDenied:
            log.append(f"{name} -> pid {pid} denied")


def _mem_available(proc_root: str) -> int | None:
    return read_meminfo(os.path.join(proc_root, "meminfo")).get("MemAvailable")


def _size(n: int | None) -> str:
    return fmt_bytes(n, unknown="n/a")


def _clock(t: float) -> str:
    return fmt_clock(t)
