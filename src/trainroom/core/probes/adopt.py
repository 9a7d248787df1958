"""What `trainroom attach` reads of a trainer it did not start, from /proc alone.

A candidate is one of the user's own processes with torch loaded (libtorch in /proc/PID/maps) or a
GPU context the driver lists. Attaching to a torchrun worker adopts its agent (the worker's parent),
whose workers the keeper then finds in the tree as for a launched run. What is recorded at attach
time (argv, cwd, the environment, the process's start tick) is what a takeover relaunches and what
a kill proves its target against; the log is the trainer's stdout/stderr when they are regular
files, and the checkpoint directory comes from the usual arguments.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Sequence

import msgspec
import psutil

from trainroom.core.probes.procs import PROC, process_state, same_start, start_ticks


class AdoptRefused(Exception):
    """Why a pid cannot be attached, in one line (the CLI prints it and exits 2)."""


class Adoptee(msgspec.Struct, kw_only=True):
    """A trainer to adopt, as it was when attach read it."""

    pid: int
    start_time: float
    start_ticks: int | None
    pgid: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    log: str | None  # the regular file its stdout (else stderr) goes to
    log_why: str  # where the log came from, or why there is none
    ckpt_dir: str | None  # from its arguments (see CKPT_ARGS)
    ckpt_from: str | None = None  # the argument that named it
    agent_of: int | None = None  # the worker pid the user named, when its torchrun agent is adopted
    was_run: str | None = None  # TRAINROOM_RUN in its environment: the run it was started by


class Candidate(msgspec.Struct, kw_only=True, frozen=True):
    pid: int
    age_s: float
    cmdline: str
    why: str  # "torch loaded", "GPU context"


# The arguments that name where a trainer saves: HF's --output_dir, nanoGPT's out_dir=,
# Lightning's dirpath=, and the common --save_dir / --ckpt_dir.
CKPT_ARGS = ("output_dir", "output-dir", "out_dir", "out-dir", "dirpath", "save_dir", "save-dir", "ckpt_dir")
_ARG = re.compile(r"^-{0,2}(" + "|".join(re.escape(a) for a in CKPT_ARGS) + r")(?:=(.*))?$")


def ckpt_dir_from(argv: Sequence[str], cwd: str) -> tuple[str | None, str | None]:
    """(the checkpoint directory, the argument that named it) from a command line: `--output_dir X`,
    `--output_dir=X`, `out_dir=X` (nanoGPT's configurator), `trainer.callbacks.dirpath=X`."""
    for i, word in enumerate(argv[1:], 1):
        key = word.rsplit(".", 1)[-1] if "=" in word else word
        m = _ARG.match(key)
        if m is None or (m.group(2) is None and not word.startswith("-")):
            continue
        value = m.group(2) if m.group(2) is not None else (argv[i + 1] if i + 1 < len(argv) else None)
        if value:
            value = value.strip("'\"")
            return os.path.normpath(os.path.join(cwd, os.path.expanduser(value))), word.split("=", 1)[0]
    return None, None


def still_runs(pid: int, start_time: float, ticks: int | None) -> bool:
    """The process (pid + start) still runs: not gone, not another's reused pid, not a zombie."""
    return bool(same_start(pid, start_time, ticks)) and process_state(pid) != "Z"


def has_torch(pid: int, proc_root: str = PROC) -> bool:
    """libtorch mapped into the process: torch is imported there."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps"), "rb") as f:
            return any(b"libtorch" in line for line in f)
    except OSError:
        return False


def log_of(pid: int, proc_root: str = PROC) -> tuple[str | None, str]:
    """The regular file the process's stdout (else stderr) is written to, and where that came
    from; else None and what its stdout is (a terminal, a pipe)."""
    seen = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            target = os.readlink(os.path.join(proc_root, str(pid), "fd", str(fd)))
        except OSError as exc:
            seen.append(f"{name} unreadable ({exc.strerror})")
            continue
        if target.startswith("/") and not target.endswith(" (deleted)") and os.path.isfile(target):
            return target, f"its {name} (/proc/{pid}/fd/{fd})"
        seen.append(f"{name} is {target}")
    return None, "; ".join(seen)


def is_torchrun(argv: Sequence[str]) -> bool:
    return bool(argv) and (
        os.path.basename(argv[0]) == "torchrun"
        or any(a in ("torch.distributed.run", "torchrun") for a in argv[:4])
    )


def _agent(proc: psutil.Process) -> psutil.Process | None:
    """The torchrun agent a worker runs under (its environment carries TORCHELASTIC_RUN_ID)."""
    try:
        parent = proc.parent()
        if parent is not None and is_torchrun(parent.cmdline()) and "TORCHELASTIC_RUN_ID" in proc.environ():
            return parent
    except psutil.Error:
        return None
    return None


def inspect(
    pid: int,
    *,
    gpu_pids: Callable[[], set[int]] = lambda: set(),
    proc_root: str = PROC,
) -> Adoptee:
    """The trainer `pid` names, read whole; AdoptRefused (one line) when it is gone, not the
    user's, or not a trainer."""
    if pid <= 1 or pid == os.getpid():
        raise AdoptRefused(f"pid {pid} is not a trainer")
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
    except (psutil.NoSuchProcess, ValueError):
        raise AdoptRefused(f"no such process: pid {pid}") from None
    except psutil.Error as exc:
        raise AdoptRefused(f"pid {pid} cannot be read: {exc}") from None
    if uid != os.getuid():
        raise AdoptRefused(f"pid {pid} is not yours (uid {uid}): attach watches only your own processes")
    agent = _agent(proc)
    named = pid
    if agent is not None:
        proc, pid = agent, agent.pid
    try:
        with proc.oneshot():
            argv = proc.cmdline()
            cwd = proc.cwd()
            env = proc.environ()
            created = proc.create_time()
            status = proc.status()
    except psutil.NoSuchProcess:
        raise AdoptRefused(f"no such process: pid {pid}") from None
    except psutil.Error as exc:
        raise AdoptRefused(f"pid {pid} is not yours to read ({type(exc).__name__}): not attached") from None
    if status == psutil.STATUS_ZOMBIE:
        raise AdoptRefused(f"pid {pid} has already exited (a zombie)")
    if not (has_torch(pid, proc_root) or is_torchrun(argv) or pid in gpu_pids()):
        what = " ".join(argv)[:80] or proc.name()
        raise AdoptRefused(f"pid {pid} ({what}) is not a trainer: no torch loaded and no GPU context")
    log, log_why = log_of(pid, proc_root)
    ckpt, ckpt_from = ckpt_dir_from(argv, cwd)
    try:
        pgid = os.getpgid(pid)
    except OSError:
        pgid = 0
    return Adoptee(
        pid=pid,
        start_time=created,
        start_ticks=start_ticks(pid, proc_root),
        pgid=pgid,
        argv=argv,
        cwd=cwd,
        env=dict(env),
        log=log,
        log_why=log_why,
        ckpt_dir=ckpt,
        ckpt_from=ckpt_from,
        agent_of=named if agent is not None else None,
        was_run=env.get("TRAINROOM_RUN"),
    )


def candidates(
    gpu_pids: Iterable[int] = (), proc_root: str = PROC, now: float | None = None
) -> list[Candidate]:
    """The user's processes that look like trainers (torch loaded, or a GPU context), oldest
    first; a torchrun worker is shown under its agent, not on its own."""
    now = time.time() if now is None else now
    gpu = set(gpu_pids)
    me, uid = os.getpid(), os.getuid()
    out: list[Candidate] = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline", "create_time", "name"]):
        info = proc.info
        pid = int(info["pid"])
        uids = info.get("uids")
        if pid == me or uids is None or uids.real != uid:
            continue
        torch = has_torch(pid, proc_root)
        if not (torch or pid in gpu):
            continue
        if _agent(proc) is not None:
            continue
        argv = info.get("cmdline") or [info.get("name") or "?"]
        if any(a.startswith("trainroom.") for a in argv[1:3]):
            continue  # trainroom's own (a keeper's warm verifier imports torch)
        out.append(
            Candidate(
                pid=pid,
                age_s=max(0.0, now - float(info.get("create_time") or now)),
                cmdline=" ".join(argv),
                why="torch loaded" if torch else "GPU context",
            )
        )
    return sorted(out, key=lambda c: -c.age_s)
