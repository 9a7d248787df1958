"""What this host allows a run, one typed `Check` each: the state dir, the config, WSL, the
checkpoint root's filesystem and free space, host RAM, the page-cache reclaim method, stack dumps
and ssh. The GPU's checks and the report that gathers them are in `ops.doctor`.

Each check is a function of the roots and paths it reads, so a test points it at a prepared tree,
and each reuses the module that acts on the same thing (probes.host, health.diskguard,
ops.reclaim, ops.stacks, run.store): what doctor says is what the keeper will find.

A check is `missing` only when the run it is asked about cannot do without it (`needed`); an
absent thing the run can do without is `degraded`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

from trainroom.core.configuration.config import Config, Thresholds, load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.health import diskguard
from trainroom.core.ops.reclaim import ReclaimPlan, plan_reclaim
from trainroom.core.ops.stacks import ptrace_access
from trainroom.core.probes.host import HostProbe, is_wsl
from trainroom.core.run import store
from trainroom.core.units import fmt_bytes

Status = Literal["ok", "degraded", "missing"]
Fact = str | int | float | bool | None
SudoProbe = Callable[[str], "str | None"]
SUDO_TIMEOUT_S = 10.0


class Check(msgspec.Struct, kw_only=True):
    name: str
    status: Status
    detail: str  # what was found, with its figures
    fix: str = ""  # what to do about it; empty when nothing is to be done
    needed: bool = False  # whether the configured run cannot do without what this checks
    facts: dict[str, Fact] = {}


def absent(needed: bool) -> Status:
    """The status of something that is not there."""
    return "missing" if needed else "degraded"


# --------------------------------------------------------------------------- state dir, config


def check_state_dir(state_dir: Path) -> Check:
    """The state dir: writable, private, and short enough for a run's Unix socket."""
    # The longest socket path a run can get: a run id with the longest slug new_run_id makes.
    longest_id = store.new_run_id(["python", "x" * 64 + ".py"])
    sock = state_dir / "runs" / longest_id / store.SOCKET_NAME
    facts: dict[str, Fact] = {
        "path": str(state_dir),
        "exists": state_dir.is_dir(),
        "socket_path_bytes": len(os.fsencode(sock)),
        "socket_path_limit": store.MAX_SOCKET_PATH,
    }
    name = "state_dir"
    if len(os.fsencode(sock)) > store.MAX_SOCKET_PATH:
        return Check(
            name=name,
            status="missing",
            needed=True,
            facts=facts,
            detail=f"{state_dir}: a run's socket path would take {facts['socket_path_bytes']} bytes, "
            f"over the {store.MAX_SOCKET_PATH} a Unix socket allows",
            fix="set TRAINROOM_HOME to a shorter path (e.g. ~/.trainroom)",
        )
    if not state_dir.is_dir():
        parent = _existing_ancestor(state_dir)
        ok = os.access(parent, os.W_OK | os.X_OK)
        return Check(
            name=name,
            status="ok" if ok else "missing",
            needed=True,
            facts=facts,
            detail=f"{state_dir} does not exist yet; "
            + (f"the first launch creates it (0700) under {parent}" if ok else f"{parent} is not writable"),
            fix="" if ok else f"set TRAINROOM_HOME to a directory you can write, or make {parent} writable",
        )
    st = state_dir.stat()
    mode = stat.S_IMODE(st.st_mode)
    facts |= {"mode": f"{mode:04o}", "owner_uid": st.st_uid}
    room = f"a run's socket path takes at most {facts['socket_path_bytes']} of {store.MAX_SOCKET_PATH} bytes"
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return Check(
            name=name,
            status="missing",
            needed=True,
            facts=facts,
            detail=f"{state_dir} is not writable by uid {os.geteuid()} (mode {mode:04o}, owner {st.st_uid})",
            fix=f"chown/chmod {state_dir}, or set TRAINROOM_HOME to a directory you own",
        )
    if st.st_uid != os.geteuid() or mode & 0o077:
        return Check(
            name=name,
            status="degraded",
            needed=True,
            facts=facts,
            detail=f"{state_dir}: mode {mode:04o}, owner uid {st.st_uid}: other users can read the runs' "
            f"journals and trainer logs or reach their keepers' sockets; {room}",
            fix=f"chmod 700 {shlex.quote(str(state_dir))}, or set TRAINROOM_HOME to a directory of your own "
            "(launch never changes the mode of a directory it did not create)",
        )
    return Check(
        name=name,
        status="ok",
        needed=True,
        facts=facts,
        detail=f"{state_dir}: mode {mode:04o}, yours, writable; {room}",
    )


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_config(project_dir: Path, state_dir: Path) -> tuple[Check, Config | None]:
    """trainroom.toml as `launch` reads it; a bad one is missing: launch refuses it (exit 2)."""
    try:
        config, path = load_config(project_dir, state_dir)
    except ConfigError as exc:
        return Check(
            name="config",
            status="missing",
            needed=True,
            detail=str(exc),
            fix="correct the key it names (README: trainroom.toml); `launch` refuses the file until then",
        ), None
    where = (
        f"{path}"
        if path is not None
        else f"no trainroom.toml in {project_dir} or {state_dir}: built-in defaults"
    )
    locks = ", ".join(config.lock_files) or "none"
    return Check(
        name="config",
        status="ok",
        needed=True,
        facts={"path": str(path) if path else None, "lock_files": len(config.lock_files)},
        detail=f"{where}; lock files: {locks}",
    ), config


# --------------------------------------------------------------------------- host


def check_wsl(proc_root: str) -> Check:
    wsl = is_wsl(proc_root)
    kernel = _first_line(Path(proc_root, "sys", "kernel", "osrelease"))
    facts: dict[str, Fact] = {"wsl": wsl, "kernel": kernel}
    if not wsl:
        return Check(name="wsl", status="ok", facts=facts, detail=f"not WSL (kernel {kernel or 'unknown'})")
    return Check(
        name="wsl",
        status="degraded",
        facts=facts,
        detail=f"WSL (kernel {kernel or 'unknown'}): the driver reports no per-process GPU memory (WDDM), "
        "a dead context's VRAM stays until the VM restarts, and the page cache is VM memory Windows "
        "gets back only once it is dropped",
        fix="keep checkpoints on the Linux filesystem (not /mnt/c); clear ghost VRAM with "
        "`wsl --shutdown` from Windows; `trainroom reclaim` before a resume",
    )


def _first_line(path: Path) -> str | None:
    try:
        return path.read_text().splitlines()[0].strip() or None
    except (OSError, IndexError):
        return None


def check_ckpt_fs(root: Path, mounts_path: str) -> Check:
    """The checkpoint root: writable (a run saves there) and not on 9p/drvfs (truncated saves)."""
    mount = diskguard.mount_of(str(root), diskguard.read_mounts(mounts_path))
    parent = _existing_ancestor(root)
    writable = os.access(parent, os.W_OK | os.X_OK)
    facts: dict[str, Fact] = {
        "path": str(root),
        "exists": root.is_dir(),
        "fstype": mount.fstype if mount else None,
        "mountpoint": mount.mountpoint if mount else None,
        "writable": writable,
    }
    on = (
        f"{mount.fstype} (mounted at {mount.mountpoint})"
        if mount
        else "a filesystem /proc/mounts does not name"
    )
    if not writable:
        return Check(
            name="ckpt_fs",
            status="missing",
            needed=True,
            facts=facts,
            detail=f"checkpoint root {root}: {parent} is not writable",
            fix="point the checkpoint root at a directory you can write: `launch --ckpt-root` or [checkpoints] root",
        )
    remote = diskguard.drvfs_checkpoints(str(root), mount)
    if remote is not None:
        return Check(
            name="ckpt_fs",
            status="degraded",
            needed=True,
            facts=facts,
            detail=remote.message,
            fix="`launch --ckpt-root ~/ckpt` (or [checkpoints] root) on the Linux filesystem",
        )
    made = "" if root.is_dir() else " (created at the first save)"
    return Check(name="ckpt_fs", status="ok", needed=True, facts=facts, detail=f"{root}{made} on {on}")


def check_disk(root: Path, thresholds: Thresholds, statvfs: diskguard.StatvfsFn = os.statvfs) -> Check:
    """Free space where checkpoints go: missing when not even the save reserve is left."""
    try:
        usage = diskguard.disk_usage(root, statvfs)
    except OSError as exc:
        return Check(
            name="disk",
            status="missing",
            needed=True,
            detail=f"cannot read the filesystem of {root}: {exc.strerror or exc}",
            fix="point the checkpoint root at a readable, mounted filesystem",
        )
    reserve = diskguard.reserve_for(usage)
    facts: dict[str, Fact] = {
        "path": str(root),
        "total_bytes": usage.total_bytes,
        "free_bytes": usage.free_bytes,
        "used_fraction": round(usage.used_fraction, 4),
        "reserve_bytes": reserve,
    }
    figures = (
        f"{fmt_bytes(usage.free_bytes)} free of {fmt_bytes(usage.total_bytes)} "
        f"({usage.used_fraction * 100:.0f}% used) at {root}"
    )
    if not diskguard.next_save_fits(usage, 0, reserve):
        return Check(
            name="disk",
            status="missing",
            needed=True,
            facts=facts,
            detail=f"{figures}: under the {fmt_bytes(reserve)} a save must leave free, so no checkpoint fits",
            fix="free space (`trainroom prune`) or point the checkpoint root at another disk",
        )
    high = diskguard.disk_high(usage, thresholds)
    if high is not None:
        return Check(
            name="disk",
            status="degraded",
            needed=True,
            facts=facts,
            detail=high.message,
            fix="`trainroom prune` or free space before a long run",
        )
    return Check(name="disk", status="ok", needed=True, facts=facts, detail=figures)


def check_host_ram(proc_root: str, cgroup_root: str, thresholds: Thresholds) -> Check:
    sample = HostProbe(proc_root=proc_root, cgroup_root=cgroup_root).sample()
    avail = sample.effective_available_bytes
    if not sample.available or avail is None:
        return Check(name="host_ram", status="degraded", detail=sample.reason or "no figures")
    cg = sample.cgroup
    limit = cg.limit_bytes if cg is not None else None
    cache = sample.page_cache_bytes
    facts: dict[str, Fact] = {
        "mem_total_bytes": sample.mem_total_bytes,
        "available_bytes": avail,
        "page_cache_bytes": cache,
        "cgroup_version": cg.version if cg is not None else None,
        "cgroup_limit_bytes": limit,
    }
    figures = f"{fmt_bytes(avail)} available of {fmt_bytes(sample.mem_total_bytes)}" + (
        f" (cgroup limit {fmt_bytes(limit)})" if limit else ""
    )
    figures += f", {fmt_bytes(cache)} in the page cache"
    if avail < thresholds.host_ram_low_bytes:
        return Check(
            name="host_ram",
            status="degraded",
            facts=facts,
            detail=f"{figures}: under {fmt_bytes(thresholds.host_ram_low_bytes)}, where torch.load of a "
            "checkpoint fails with ENOMEM",
            fix="`trainroom reclaim` gives the page cache back; or stop what holds the memory",
        )
    return Check(name="host_ram", status="ok", facts=facts, detail=figures)


def sudo_refusal(script: str) -> str | None:
    """None when `sudo -n` would run `sh -c script` without asking for a password; else why not.
    Asks sudo's policy (`sudo -n -l`), which runs nothing as root."""
    import sh  # external commands go through sh

    try:
        sudo = sh.Command("sudo")
    except sh.CommandNotFound:
        return "sudo is not installed"
    try:
        sudo("-n", "-l", "sh", "-c", script, _timeout=SUDO_TIMEOUT_S)
    except sh.ErrorReturnCode as exc:
        lines = exc.stderr.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "not allowed without a password"
    except sh.TimeoutException:
        return f"no answer in {SUDO_TIMEOUT_S:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_reclaim(cgroup_root: str, proc_root: str, sudo: SudoProbe = sudo_refusal) -> Check:
    """The method `trainroom reclaim` would use here, and whether it can write it (directly or
    through `sudo -n`) or must hand a human the command."""
    plan: ReclaimPlan = plan_reclaim(cgroup_root, proc_root)
    facts: dict[str, Fact] = {
        "method": plan.method,
        "target": plan.target,
        "page_cache_bytes": plan.page_cache_bytes,
        "via": None,
    }
    what = f"{plan.method} ({plan.target})"
    passed = f"; passed over: {'; '.join(plan.passed_over)}" if plan.passed_over else ""
    if not os.path.exists(plan.target):
        return Check(
            name="reclaim",
            status="degraded",
            facts=facts,
            detail=f"no reclaim method: {plan.target} does not exist{passed}",
            fix="none here; the kernel frees the page cache under pressure (or a resume may hit ENOMEM)",
        )
    if os.access(plan.target, os.W_OK):
        facts["via"] = "direct"
        return Check(name="reclaim", status="ok", facts=facts, detail=f"{what}, written directly{passed}")
    refusal = sudo(plan.script)
    if refusal is None:
        facts["via"] = "sudo"
        return Check(name="reclaim", status="ok", facts=facts, detail=f"{what}, through sudo -n{passed}")
    return Check(
        name="reclaim",
        status="degraded",
        facts=facts,
        detail=f"{what} is not writable here and sudo -n says: {refusal}; `trainroom reclaim` will "
        f"print the command for a human{passed}",
        fix=plan.manual_command,
    )


def check_stacks(proc_root: str, py_spy: str | None = None) -> Check:
    """py-spy and ptrace rights: what dumping an uninstrumented (or a stopped) trainer needs.
    An instrumented trainer dumps itself through faulthandler (SIGUSR1) either way."""
    access = ptrace_access(proc_root, py_spy)
    facts: dict[str, Fact] = {
        "py_spy": access.py_spy,
        "ptrace_scope": access.scope,
        "cap_sys_ptrace": access.cap_sys_ptrace,
    }
    either = "instrumented trainers still dump their stacks through faulthandler (SIGUSR1)"
    if access.py_spy is None:
        return Check(
            name="stacks",
            status="degraded",
            facts=facts,
            detail=f"py-spy is not installed: an uninstrumented or stopped trainer's stacks cannot be "
            f"dumped ({either})",
            fix="pip install py-spy (in any environment: it reads the trainer from outside)",
        )
    if not access.allowed:
        return Check(
            name="stacks",
            status="degraded",
            facts=facts,
            detail=f"py-spy at {access.py_spy}, but {access.reason} ({either})",
            fix="sudo sysctl kernel.yama.ptrace_scope=0 (until reboot), or run as root",
        )
    return Check(
        name="stacks", status="ok", facts=facts, detail=f"py-spy at {access.py_spy}; {access.reason}"
    )


def check_ssh(which: Callable[[str], str | None] = shutil.which) -> Check:
    path = which("ssh")
    if path is None:
        return Check(
            name="ssh",
            status="degraded",
            facts={"path": None},
            detail="no ssh client: a keeper on another machine cannot be reached from here",
            fix="install an OpenSSH client (e.g. apt install openssh-client)",
        )
    return Check(name="ssh", status="ok", facts={"path": path}, detail=f"ssh at {path}")
