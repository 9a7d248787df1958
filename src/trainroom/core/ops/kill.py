"""Kill an attempt's process group and confirm it is gone, down to the driver's memory.

Two steps, so a client can show the exact target before anything is signalled:

- `plan_kill` names the target: the attempt's PGID, every live member (pid, cmdline, state), and
  the leader's descendants that left the group (dataloader workers or async-save children that
  called setsid). It refuses a PGID <= 1, our own group, the keeper's, a leader whose create
  time no longer matches the attempt's (PID reuse), or a group with nothing in it.
- `execute_kill` sends SIGTERM to the group, waits the grace, SIGKILLs what is left, confirms
  every member is gone (a zombie counts as gone: it holds no memory, only a slot in the process
  table until its parent reaps it), then polls the driver's view of the run's VRAM until it is
  under the tolerance (the seed: 12 GB -> 400 MiB) or the timeout passes.

Both return Structs; `as_dict()` gives the JSON-able form for Reply and ActionRecord.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import msgspec
import psutil

# Identity is (pid, start): the start's clock tick where recorded (exact), else psutil's create
# time within a tolerance (probes.procs.same_start).
from trainroom.core.probes.procs import same_start, started_since
from trainroom.core.probes.procs import start_ticks as _ticks_of

# How long to wait, after SIGKILL, for the kernel to tear the processes down (a process in
# uninterruptible sleep inside a driver call dies only when that call returns).
KILL_CONFIRM_S = 5.0
POLL_S = 0.1

VramProbe = Callable[[], "int | None"]
Progress = Callable[[str], None]


class Member(msgspec.Struct, kw_only=True):
    pid: int
    ppid: int
    pgid: int | None
    cmdline: list[str]
    state: str
    create_time: float
    start_ticks: int | None = None  # /proc/<pid>/stat field 22
    rss_bytes: int | None = None
    in_group: bool = True  # False: a descendant of the leader that left the process group


class KillPlan(msgspec.Struct, kw_only=True):
    pgid: int
    leader_pid: int
    leader_start_time: float
    leader_start_ticks: int | None = None
    members: list[Member] = []
    refusals: list[str] = []
    # The group has no live member left (the attempt died whole, e.g. SIGKILLed): a refusal to
    # signal, but not an error for a caller whose aim is "nothing of that attempt is left".
    empty: bool = False

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def nothing_left(self) -> bool:
        """Refused only because nothing of the attempt is alive: what remains to confirm is the
        driver's memory (a context can outlive its process)."""
        return self.empty and len(self.refusals) == 1

    def as_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self) | {"ok": self.ok, "nothing_left": self.nothing_left}


class KillResult(msgspec.Struct, kw_only=True):
    ok: bool
    message: str
    pgid: int
    signals: list[str] = []  # "SIGTERM -> pgid 123", "SIGKILL -> pid 456"
    survivors: list[Member] = []  # still alive at the end (none when ok)
    vram_released: bool | None = None  # None: the driver view was unavailable
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


# --------------------------------------------------------------------------- plan


def plan_kill(
    attempt_pid: int,
    attempt_pgid: int,
    attempt_start_time: float,
    *,
    attempt_start_ticks: int | None = None,
    keeper_pid: int | None = None,
) -> KillPlan:
    """The exact target of a kill of this attempt, or the reasons to refuse it."""
    plan = KillPlan(
        pgid=attempt_pgid,
        leader_pid=attempt_pid,
        leader_start_time=attempt_start_time,
        leader_start_ticks=attempt_start_ticks,
    )
    ticks = attempt_start_ticks
    refusals = plan.refusals
    if attempt_pgid <= 1:
        refusals.append(f"refusing pgid {attempt_pgid}: a group <= 1 is the whole system or init")
        return plan
    own_pgid = os.getpgid(0)
    if attempt_pgid == own_pgid:
        refusals.append(f"refusing pgid {attempt_pgid}: it is our own process group")
    if keeper_pid is not None:
        keeper_pgid = _pgid_of(keeper_pid)
        if keeper_pgid == attempt_pgid:
            refusals.append(
                f"refusing pgid {attempt_pgid}: it is the keeper's process group (keeper pid {keeper_pid})"
            )

    leader = _process(attempt_pid)
    if leader is not None:
        try:
            created = leader.create_time()
            same = same_start(attempt_pid, attempt_start_time, ticks)
        except psutil.Error:
            leader = None
        else:
            if same is None:
                leader = None
            elif not same:
                now_ticks = _ticks_of(attempt_pid)
                at = (
                    f" (tick {now_ticks}, the attempt's {ticks})"
                    if ticks is not None and now_ticks is not None
                    else ""
                )
                refusals.append(
                    f"refusing pid {attempt_pid}: it started at {_clock(created)}, the attempt's at "
                    f"{_clock(attempt_start_time)}{at} (the PID was reused)"
                )
                return plan

    members = [m for m in _group_members(attempt_pgid)]
    protected = {os.getpid(), keeper_pid} - {None}
    # A member older than the attempt cannot be part of it: the group number was reused.
    older = [m for m in members if not started_since(m.create_time, m.start_ticks, attempt_start_time, ticks)]
    if older:
        refusals.append(
            f"refusing pgid {attempt_pgid}: pid {older[0].pid} in it started at {_clock(older[0].create_time)}, "
            f"before the attempt ({_clock(attempt_start_time)}): the group number was reused"
        )
    seen = {m.pid for m in members}
    # Descendants of the leader and of every member, wherever their group is now.
    roots = ([leader] if leader is not None else []) + [p for p in (_process(m.pid) for m in members) if p]
    for root in roots:
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            if child.pid in seen:
                continue
            member = _describe(child, in_group=False)
            if member is not None and started_since(
                member.create_time, member.start_ticks, attempt_start_time, ticks
            ):
                seen.add(child.pid)
                members.append(member)
    hit = sorted(protected & {m.pid for m in members})
    if hit:
        refusals.append(f"refusing pgid {attempt_pgid}: it contains pid {hit[0]}, ours or the keeper's")
    plan.members = sorted(members, key=lambda m: (not m.in_group, m.pid))
    if not plan.members and not refusals:
        plan.empty = True
        refusals.append(f"no such process group: pgid {attempt_pgid} has no live members")
    return plan


def live_members(pgid: int, attempt_start_time: float, attempt_start_ticks: int | None = None) -> list[int]:
    """The pids still alive in an attempt's process group (zombies excluded). A member that
    started before the attempt is not part of it: the group number was reused by a stranger."""
    if pgid <= 1:
        return []
    return sorted(
        m.pid
        for m in _group_members(pgid)
        if started_since(m.create_time, m.start_ticks, attempt_start_time, attempt_start_ticks)
    )


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
) -> KillResult:
    """SIGTERM the group, SIGKILL what outlives the grace, confirm it is gone and the VRAM freed.

    Blocking (up to grace + a few seconds + vram_timeout_s): run it in a worker thread, with
    `progress` posting each line to the requesting client.
    """
    say = progress or (lambda _line: None)
    if plan.nothing_left:
        return _confirm_nothing_left(
            plan, vram_probe, tolerance_bytes, vram_timeout_s, vram_poll_s, say, proc_root
        )
    if not plan.ok:
        return KillResult(ok=False, message="; ".join(plan.refusals), pgid=plan.pgid)

    targets = _handles(plan)
    vram_before = _probe(vram_probe)
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
        say(f"SIGTERM sent to pgid {plan.pgid} ({len(alive)} live)")
        alive = _wait_gone(targets, plan, grace_s)
    if alive:
        say(f"{len(alive)} still alive after the {grace_s:g} s grace: SIGKILL")
        # Members forked during the grace are in the group too: pick them up before SIGKILL.
        _adopt_new_members(plan, targets)
        _signal_all(plan, targets, signal.SIGKILL, signals)
        alive = _wait_gone(targets, plan, KILL_CONFIRM_S)

    survivors = [m for m in (_describe(p, in_group=True) for p in alive) if m is not None]
    after: dict[str, Any] = {"members": len(survivors), "pids": [m.pid for m in survivors]}
    if survivors:
        states = ", ".join(f"{m.pid} ({m.state})" for m in survivors)
        after |= {"vram_bytes": _probe(vram_probe), "mem_available_bytes": _mem_available(proc_root)}
        return KillResult(
            ok=False,
            message=f"{len(survivors)} of {len(targets)} processes survived SIGKILL: {states}",
            pgid=plan.pgid,
            signals=signals,
            survivors=survivors,
            before=before,
            after=after,
        )
    say(f"all {len(targets)} processes of pgid {plan.pgid} are gone")

    released, vram_after, waited = _wait_vram(
        vram_probe, vram_before, tolerance_bytes, vram_timeout_s, vram_poll_s, say
    )
    after |= {
        "vram_bytes": vram_after,
        "mem_available_bytes": _mem_available(proc_root),
        "vram_wait_s": round(waited, 1),
    }
    gone = f"{len(targets)} processes of pgid {plan.pgid} gone"
    if released is None:
        message = f"{gone}; driver view unavailable, VRAM release not confirmed"
    elif released:
        message = f"{gone}; VRAM {_size(vram_before)} -> {_size(vram_after)}"
    else:
        message = (
            f"{gone}; but the driver still holds {_size(vram_after)} after {vram_timeout_s:g} s "
            f"(tolerance {_size(tolerance_bytes)})"
        )
    return KillResult(
        ok=released is not False,
        message=message,
        pgid=plan.pgid,
        signals=signals,
        vram_released=released,
        before=before,
        after=after,
    )


def _confirm_nothing_left(
    plan: KillPlan,
    vram_probe: VramProbe | None,
    tolerance_bytes: int,
    vram_timeout_s: float,
    vram_poll_s: float,
    say: Progress,
    proc_root: str,
) -> KillResult:
    """Nothing to signal: the group is empty. Still confirm what a kill confirms, that the
    driver gave the memory back (a context that outlived its process still holds it)."""
    vram_before = _probe(vram_probe)
    before = {
        "members": 0,
        "pids": [],
        "vram_bytes": vram_before,
        "mem_available_bytes": _mem_available(proc_root),
    }
    say(f"nothing left to signal: pgid {plan.pgid} has no live members")
    released, vram_after, waited = _wait_vram(
        vram_probe, vram_before, tolerance_bytes, vram_timeout_s, vram_poll_s, say
    )
    after = {
        "members": 0,
        "pids": [],
        "vram_bytes": vram_after,
        "mem_available_bytes": _mem_available(proc_root),
        "vram_wait_s": round(waited, 1),
    }
    gone = f"nothing left to kill: pgid {plan.pgid} has no live members"
    if released is None:
        message = f"{gone}; driver view unavailable, VRAM release not confirmed"
    elif released:
        message = f"{gone}; VRAM {_size(vram_before)} -> {_size(vram_after)}"
    else:
        message = (
            f"{gone}; but the driver still holds {_size(vram_after)} after {vram_timeout_s:g} s "
            f"(tolerance {_size(tolerance_bytes)})"
        )
    return KillResult(
        ok=released is not False,
        message=message,
        pgid=plan.pgid,
        vram_released=released,
        before=before,
        after=after,
    )


def run_vram_probe(
    gpu_probe: Any, pids: Collection[int], devices: Collection[int] | None = None
) -> VramProbe:
    """A VramProbe over a GpuProbe (anything with `sample(our_pids) -> GpuSample`, see probes/gpu.py).

    Where the driver reports per-process memory (and its PIDs are ours to see), the run's share
    is the memory of the run's pids plus contexts whose pid no longer exists here: a context that
    outlived its process is what still holds the memory after a kill (nvidia-smi's "[Not Found]").
    Where it does not (WSL2/WDDM, MIG, another PID namespace), it is the devices' used memory, as
    NVRx checks before a restart (the seed: 12 GB -> 400 MiB). None: the driver view is
    unavailable.
    """
    run_pids = set(pids)
    wanted = None if devices is None else set(devices)

    def probe() -> int | None:
        sample = gpu_probe.sample(run_pids)
        if not sample.available:
            return None
        if sample.per_process and sample.pid_namespace == "host":
            return sum(
                x.used_bytes or 0
                for x in sample.processes
                if (wanted is None or x.device in wanted) and (x.pid in run_pids or not x.exists)
            )
        used = [
            d.used_bytes
            for d in sample.devices
            if (wanted is None or d.index in wanted) and d.used_bytes is not None
        ]
        return sum(used) if used else None

    return probe


# --------------------------------------------------------------------------- helpers


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _describe(proc: psutil.Process, *, in_group: bool) -> Member | None:
    try:
        with proc.oneshot():
            state = proc.status()
            if state == psutil.STATUS_ZOMBIE:
                return None  # holds nothing; waits only for its parent to reap it
            try:
                cmdline = proc.cmdline()
            except psutil.AccessDenied:
                cmdline = [proc.name()]
            try:
                rss: int | None = proc.memory_info().rss
            except psutil.AccessDenied:
                rss = None
            return Member(
                pid=proc.pid,
                ppid=proc.ppid(),
                pgid=_pgid_of(proc.pid),
                cmdline=cmdline,
                state=state,
                create_time=proc.create_time(),
                start_ticks=_ticks_of(proc.pid),
                rss_bytes=rss,
                in_group=in_group,
            )
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _group_members(pgid: int) -> list[Member]:
    """The live members of a process group, by each process's current pgid."""
    found: list[Member] = []
    for proc in psutil.process_iter():
        if _pgid_of(proc.pid) != pgid:
            continue
        member = _describe(proc, in_group=True)
        if member is not None:
            found.append(member)
    return found


def _handles(plan: KillPlan) -> dict[int, psutil.Process]:
    """psutil handles for the planned members whose create time still matches (not reused)."""
    handles: dict[int, psutil.Process] = {}
    for m in plan.members:
        proc = _process(m.pid)
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
    """Whether killpg still reaches the attempt's group: a live process whose pid is the pgid
    and that started at another time means the number now names someone else's group."""
    try:
        return same_start(plan.pgid, plan.leader_start_time, plan.leader_start_ticks) is not False
    except psutil.Error:
        return True


def _live_group_members(plan: KillPlan) -> list[psutil.Process]:
    found = []
    for m in _group_members(plan.pgid):
        if started_since(m.create_time, m.start_ticks, plan.leader_start_time, plan.leader_start_ticks):
            proc = _process(m.pid)
            if proc is not None:
                found.append(proc)
    return found


def _wait_gone(targets: dict[int, psutil.Process], plan: KillPlan, timeout_s: float) -> list[psutil.Process]:
    """Poll until every target and every current member of the group is gone, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in _live_group_members(plan):
            targets.setdefault(proc.pid, proc)
        alive = _alive(targets)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def _adopt_new_members(plan: KillPlan, targets: dict[int, psutil.Process]) -> None:
    for proc in _live_group_members(plan):
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
        in_group = _pgid_of(pid) == plan.pgid
        if grouped and in_group:
            continue
        try:
            proc.send_signal(sig)  # checks the create time first: never a reused PID
            log.append(f"{name} -> pid {pid}")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        except psutil.AccessDenied:
            log.append(f"{name} -> pid {pid} denied")


def _probe(vram_probe: VramProbe | None) -> int | None:
    if vram_probe is None:
        return None
    try:
        value = vram_probe()
    except Exception:  # one failing probe never breaks the kill; it reads as "unavailable"
        return None
    return None if value is None else int(value)


def _wait_vram(
    vram_probe: VramProbe | None,
    before: int | None,
    tolerance_bytes: int,
    timeout_s: float,
    poll_s: float,
    say: Progress,
) -> tuple[bool | None, int | None, float]:
    """(released, last reading, seconds waited); released is None when the driver view is
    unavailable."""
    start = time.monotonic()
    value = _probe(vram_probe) if vram_probe is not None else None
    if value is None:
        return None, None, 0.0
    announced = False
    while value is not None and value >= tolerance_bytes:
        waited = time.monotonic() - start
        if waited >= timeout_s:
            return False, value, waited
        if not announced:
            say(
                f"waiting for the driver to release VRAM: {_size(value)} held, tolerance {_size(tolerance_bytes)}"
            )
            announced = True
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
        value = _probe(vram_probe)
    if value is None:
        return None, None, time.monotonic() - start
    return True, value, time.monotonic() - start


def _mem_available(proc_root: str) -> int | None:
    try:
        for line in Path(proc_root, "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _size(n: int | None) -> str:
    if n is None:
        return "n/a"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 100):02d}"
