"""Give the page cache back before a resume: the way this host allows, with evidence.

A checkpoint read leaves gigabytes of page cache behind; the kernel would drop it under
pressure, but `torch.load` of the next attempt fails with ENOMEM first when MemAvailable is
short (scenario 13: under 3 GB free), and under WSL2 the cache is memory that Windows does not get
back. Three ways, in order:

1. cgroup v2 `memory.reclaim` (kernel >= 5.19): write a byte count; reclaims only what is charged
   to our cgroup, gradually, and works without root where the cgroup is delegated to the user.
   We ask for the cgroup's file pages with `swappiness=0` so no live process's anonymous memory
   is pushed to swap; kernels that predate that key get the plain byte count.
2. cgroup v1 `memory.force_empty`, only where safe: when the cgroup is not the hierarchy's root
   and holds no task but ours. Why: force_empty reclaims every page charged to the cgroup,
   anonymous memory included (a live process's working set goes to swap), keeps retrying until
   usage reaches zero, and older kernels refuse it with EBUSY while tasks remain. With only us
   inside, what it frees is the dead trainer's cache.
3. `sync`, then `1` into `/proc/sys/vm/drop_caches`: frees clean page cache system-wide (not
   dentries and inodes: "1", not "3", since those are cheap and rebuilding them costs a
   directory walk).

Privileges: a denied write is retried through `sudo -n` (never prompts); when that cannot run,
the result carries the exact command for a human. All paths live under injectable roots so
tests run against a temporary tree that mimics /sys/fs/cgroup and /proc.
"""

from __future__ import annotations

import errno
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict

import msgspec

from trainroom.core.probes.host import read_meminfo
from trainroom.core.units import fmt_bytes
from trainroom.core.vocab import ReclaimMethod, ReclaimVia

Progress = Callable[[str], None]
SUDO_TIMEOUT_S = 60.0


class ReclaimPlan(msgspec.Struct, kw_only=True):
    method: ReclaimMethod
    target: str  # the control file written
    value: str  # what is written to it
    fallback_value: str | None = None  # what is written if the kernel refuses `value` (EINVAL)
    bytes_requested: int | None = None  # memory.reclaim only: the cgroup's page cache
    script: str = ""  # the same write as a shell script (what sudo runs)
    cgroup: str | None = None  # the cgroup path from <proc_root>/<pid>/cgroup
    passed_over: list[str] = []  # why the methods before this one were not used
    page_cache_bytes: int | None = None
    mem_available_bytes: int | None = None
    wsl: bool = False
    wsl_note: str | None = None
    manual_command: str = ""  # the same reclaim as one shell command, for a human to run

    def as_dict(self) -> dict[str, Any]:
        return _builtins(self)


def _builtins(x: msgspec.Struct) -> dict[str, Any]:
    out = msgspec.to_builtins(x)
    assert isinstance(out, dict)
    return out


class ReclaimResult(msgspec.Struct, kw_only=True):
    ok: bool
    method: ReclaimMethod
    via: ReclaimVia | None  # None: nothing was written
    message: str
    target: str
    manual_command: str = ""
    wsl_note: str | None = None
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}

    def as_dict(self) -> dict[str, Any]:
        return _builtins(self)


# --------------------------------------------------------------------------- observations


def memory_figures(proc_root: str | os.PathLike[str] = "/proc") -> dict[str, int | None]:
    """MemAvailable and the page cache (Cached + Buffers), in bytes."""
    info = read_meminfo(os.path.join(proc_root, "meminfo"))
    cache = info.get("Cached", 0) + info.get("Buffers", 0) if "Cached" in info else None
    return {"mem_available_bytes": info.get("MemAvailable"), "page_cache_bytes": cache}


def detect_wsl(proc_root: str | os.PathLike[str] = "/proc", env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("WSL_DISTRO_NAME"):
        return True
    try:
        return "microsoft" in Path(proc_root, "version").read_text().lower()
    except OSError:
        return False


def cgroup_paths(proc_root: str | os.PathLike[str] = "/proc", pid: int | str = "self") -> dict[str, str]:
    """{"v2": path, "memory": v1 memory path} from <proc_root>/<pid>/cgroup."""
    out: dict[str, str] = {}
    try:
        text = Path(proc_root, str(pid), "cgroup").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            out["v2"] = path
        elif "memory" in controllers.split(","):
            out["memory"] = path
    return out


# --------------------------------------------------------------------------- plan


def plan_reclaim(
    sys_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_root: str | os.PathLike[str] = "/proc",
    *,
    pid: int | str = "self",
    env: Mapping[str, str] | None = None,
    method: ReclaimMethod | None = None,
) -> ReclaimPlan:
    """Which method would be used, on which file, with what value; and the page cache now.

    `method` forces one (e.g. drop_caches after a cgroup reclaim that freed little, since
    memory.reclaim frees only this cgroup's share).
    """
    sys_root, proc_root = Path(sys_root), Path(proc_root)
    figures = memory_figures(proc_root)
    wsl = detect_wsl(proc_root, env)
    cgroups = cgroup_paths(proc_root, pid)
    drop = proc_root / "sys" / "vm" / "drop_caches"
    # The last resort, and the shape every other plan takes its common fields from.
    plan = ReclaimPlan(
        method="drop_caches",
        target=str(drop),
        value="1",
        wsl=wsl,
        wsl_note=_wsl_note(figures["page_cache_bytes"]) if wsl else None,
        page_cache_bytes=figures["page_cache_bytes"],
        mem_available_bytes=figures["mem_available_bytes"],
        **_scripted(f"sync; echo 1 > {shlex.quote(str(drop))}"),
    )
    if method in (None, "cgroup2-memory.reclaim"):
        found = _cgroup2_plan(plan, sys_root, proc_root, pid, cgroups.get("v2"), figures["page_cache_bytes"])
        if found is not None:
            return found
    if method in (None, "cgroup1-memory.force_empty"):
        found = _cgroup1_plan(plan, sys_root, cgroups.get("memory"))
        if found is not None:
            return found
    return plan


def _cgroup2_plan(
    plan: ReclaimPlan, sys_root: Path, proc_root: Path, pid: int | str, v2: str | None, page_cache: int | None
) -> ReclaimPlan | None:
    found = _v2_reclaim_file(sys_root, v2) if v2 is not None else None
    if found is None:
        plan.passed_over.append(
            "cgroup v2 memory.reclaim: "
            + (
                "no v2 cgroup in " + str(proc_root / str(pid) / "cgroup")
                if v2 is None
                else f"no memory.reclaim for {v2} (kernel < 5.19 or memory controller not on v2)"
            )
        )
        return None
    nbytes = _cgroup_file_bytes(found.parent) or page_cache or 0
    value, fallback = f"{nbytes} swappiness=0", str(nbytes)
    quoted = shlex.quote(str(found))
    return msgspec.structs.replace(
        plan,
        method="cgroup2-memory.reclaim",
        target=str(found),
        value=value,
        fallback_value=fallback,
        bytes_requested=nbytes,
        cgroup=v2,
        passed_over=list(plan.passed_over),
        **_scripted(f"echo {shlex.quote(value)} > {quoted} 2>/dev/null || echo {fallback} > {quoted}"),
    )


def _cgroup1_plan(plan: ReclaimPlan, sys_root: Path, v1: str | None) -> ReclaimPlan | None:
    if v1 is None:
        plan.passed_over.append("cgroup v1 memory.force_empty: no v1 memory cgroup")
        return None
    directory = sys_root / "memory" / v1.lstrip("/")
    target = directory / "memory.force_empty"
    unsafe = _force_empty_unsafe(directory, v1)
    if not target.exists():
        plan.passed_over.append(f"cgroup v1 memory.force_empty: {target} does not exist")
        return None
    if unsafe:
        plan.passed_over.append(f"cgroup v1 memory.force_empty: {unsafe}")
        return None
    return msgspec.structs.replace(
        plan,
        method="cgroup1-memory.force_empty",
        target=str(target),
        value="0",
        cgroup=v1,
        passed_over=list(plan.passed_over),
        **_scripted(f"echo 0 > {shlex.quote(str(target))}"),
    )


def _v2_reclaim_file(sys_root: Path, cgroup: str) -> Path | None:
    # Pure v2 mounts the hierarchy at sys_root; hybrid hosts mount it at sys_root/unified.
    for base in (sys_root, sys_root / "unified"):
        candidate = base / cgroup.lstrip("/") / "memory.reclaim"
        if candidate.exists():
            return candidate
    return None


def _cgroup_file_bytes(directory: Path) -> int | None:
    """The cgroup's page cache ("file" in memory.stat), what memory.reclaim is asked to free."""
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "file" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def _force_empty_unsafe(directory: Path, cgroup: str) -> str | None:
    """Why force_empty must not run on this cgroup, or None when it is safe."""
    if cgroup.strip("/") == "":
        return "the cgroup is the hierarchy's root (the kernel refuses force_empty there)"
    try:
        pids = {int(p) for p in (directory / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return "cannot list the cgroup's tasks (cgroup.procs unreadable), so cannot tell it is safe"
    others = sorted(pids - {os.getpid()})
    if others:
        shown = ", ".join(map(str, others[:5])) + (" ..." if len(others) > 5 else "")
        return (
            f"{len(others)} other task(s) in {cgroup} ({shown}): force_empty would reclaim their "
            f"anonymous memory too (to swap) and retry until usage is zero"
        )
    return None


def _wsl_note(page_cache: int | None) -> str:
    amount = f"about {_gib(page_cache)} of " if page_cache else ""
    return (
        f"WSL2: the Linux page cache is memory of the WSL VM (vmmem on the Windows side); dropping "
        f"it lets the VM hand {amount}those pages back to Windows (free page reporting). "
        f"memory.reclaim frees only this cgroup's share; drop_caches frees the whole VM's cache. "
        f"WSL's own autoMemoryReclaim may not fire while work is running."
    )


class _Script(TypedDict):
    script: str
    manual_command: str


def _scripted(script: str) -> _Script:
    return {"script": script, "manual_command": f"sudo sh -c {shlex.quote(script)}"}


# --------------------------------------------------------------------------- execute


def execute_reclaim(
    plan: ReclaimPlan | None = None,
    *,
    sys_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_root: str | os.PathLike[str] = "/proc",
    pid: int | str = "self",
    env: Mapping[str, str] | None = None,
    method: ReclaimMethod | None = None,
    use_sudo: bool = True,
    progress: Progress | None = None,
) -> ReclaimResult:
    """Carry out the plan (made here when not given); MemAvailable and page cache before -> after.

    Blocking (a sync can take seconds with dirty pages; a sudo call at most SUDO_TIMEOUT_S): run
    it in a worker thread.
    """
    say = progress or (lambda _line: None)
    if plan is None:
        plan = plan_reclaim(sys_root, proc_root, pid=pid, env=env, method=method)
    before = memory_figures(proc_root)
    if plan.bytes_requested == 0:
        return _result(plan, True, None, "nothing to reclaim: the cgroup holds no page cache", before, before)

    if plan.method == "drop_caches":
        say("sync (writing dirty pages first, so the drop frees them too)")
        os.sync()
    say(f"writing {plan.value!r} to {plan.target}")
    via: ReclaimVia | None = None
    partial = False
    try:
        partial = _write_control(plan.target, plan.value, plan.fallback_value)
        via = "direct"
    except OSError as exc:
        if not _is_denied(exc):
            return _refused(plan, before, f"writing {plan.target} failed: {_reason(exc)}")
        denied = f"writing {plan.target} was denied ({_reason(exc)})"
        if not use_sudo:
            return _refused(plan, before, f"{denied}; run by hand: {plan.manual_command}")
        say(f"{denied}: trying sudo -n")
        sudo_error = _run_sudo(plan)
        if sudo_error is not None:
            hint = ""
            if exc.errno == errno.EROFS:
                hint = " (read-only here, as in a container: run it on the host)"
            return _refused(
                plan,
                before,
                f"{denied}; sudo -n: {sudo_error}; run by hand{hint}: {plan.manual_command}",
            )
        via = "sudo"

    after = memory_figures(proc_root)
    freed = _delta(before["page_cache_bytes"], after["page_cache_bytes"])
    gained = _delta(after["mem_available_bytes"], before["mem_available_bytes"])
    message = (
        f"{plan.method} ({via}): page cache {_gib(before['page_cache_bytes'])} -> {_gib(after['page_cache_bytes'])}, "
        f"MemAvailable {_gib(before['mem_available_bytes'])} -> {_gib(after['mem_available_bytes'])}"
    )
    if partial:
        message += " (the cgroup gave back less than asked)"
    evidence: dict[str, Any] = {
        **after,
        "page_cache_freed_bytes": freed,
        "mem_available_gained_bytes": gained,
    }
    return _result(plan, True, via, message, before, evidence)


def _write_control(path: str, value: str, fallback: str | None) -> bool:
    """Write a control file; returns True when memory.reclaim freed less than asked (EAGAIN)."""
    try:
        _write(path, value)
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return True
        if exc.errno == errno.EINVAL and fallback is not None:
            # A kernel older than the swappiness= key: plain byte count.
            try:
                _write(path, fallback)
            except OSError as exc2:
                if exc2.errno == errno.EAGAIN:
                    return True
                raise
            return False
        raise
    return False


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _is_denied(exc: OSError) -> bool:
    return isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)


def _run_sudo(plan: ReclaimPlan) -> str | None:
    """Run the plan's command through `sudo -n`; None on success, else why it failed."""
    import sh  # external commands go through sh; imported here so a plan costs nothing

    try:
        sudo = sh.Command("sudo")
    except sh.CommandNotFound:
        return "sudo is not installed"
    try:
        sudo("-n", "sh", "-c", plan.script, _timeout=SUDO_TIMEOUT_S)
    except sh.ErrorReturnCode as exc:
        lines = exc.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {exc.exit_code}"]
        return lines[-1]
    except sh.TimeoutException:
        return f"no answer in {SUDO_TIMEOUT_S:g} s"
    except OSError as exc:
        return _reason(exc)
    return None


def _result(
    plan: ReclaimPlan,
    ok: bool,
    via: ReclaimVia | None,
    message: str,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
) -> ReclaimResult:
    return ReclaimResult(
        ok=ok,
        method=plan.method,
        via=via,
        message=message,
        target=plan.target,
        manual_command=plan.manual_command,
        wsl_note=plan.wsl_note,
        before=dict(before),
        after=dict(after),
    )


def _refused(plan: ReclaimPlan, before: Mapping[str, Any], message: str) -> ReclaimResult:
    return _result(plan, False, None, f"{plan.method}: {message}", before, before)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _gib(n: int | None) -> str:
    return fmt_bytes(n, unknown="n/a", digits=2)
