"""Dump a trainer's Python stacks: what a HUNG finding offers on one key.

- Instrumented trainer: its reporter registered `faulthandler.register(SIGUSR1, all_threads=True)`
  writing to stderr, which is the trainer log. We note the log's size, send SIGUSR1, and read back
  the block faulthandler wrote after that offset. faulthandler writes from its C signal handler,
  so it answers even when the main thread is stuck inside a C call (a collective, a lock).
- Otherwise: `py-spy dump --pid` (a dependency of the default install on Linux: it reads the
  process from outside, even a stopped one), else how to install it.
- A stopped process (SIGSTOP, a debugger) runs no code: its stacks are where it stopped, read
  by py-spy without pausing it. Whatever can be read, the answer says it is stopped and that a
  continue (SIGCONT) lets it run on: a stopped trainer is not a failed dump.
- A torchrun run: each worker in turn (`dump_targets`), labelled by its rank.

SIGUSR1's default action terminates a process, so it is sent only to a process whose kernel
signal mask says it catches SIGUSR1 (SigCgt in /proc/<pid>/status): a wrong `instrumented` flag
never kills the run.

The signal goes to one of the trainer's other threads (tgkill), not to the process: the kernel
hands a process-directed signal to the main thread first, which wakes a main thread parked on a
lock (an EINTR retry), and the watchdog then sees it "ran" and reads the hang as a stall.
faulthandler dumps every thread from whichever thread takes the signal.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil

from trainroom.core.vocab import DumpMethod

DEFAULT_TIMEOUT_S = 5.0
# faulthandler writes the whole dump in one burst; once the log has been quiet this long after
# a header, the block is complete.
QUIET_S = 0.25
POLL_S = 0.05
PY_SPY_INSTALL = (
    "py-spy is not installed (the default install brings it on Linux): `pip install py-spy` (any "
    "environment: it reads the trainer from outside), then dump again; it needs ptrace rights over the trainer (the same user with "
    "kernel.yama.ptrace_scope=0, or root / CAP_SYS_PTRACE)"
)


class StackDump(msgspec.Struct, kw_only=True):
    ok: bool
    text: str = ""
    method: DumpMethod | None = None  # None: nothing could be dumped
    message: str = ""
    stopped: bool = False  # the process was stopped (SIGSTOP, a debugger): it runs no code


class DumpTarget(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's process to dump: its rank, pid, and whether its reporter (faulthandler) runs."""

    rank: int
    pid: int
    instrumented: bool


def dump_targets(
    targets: list[DumpTarget],
    log_path: str | os.PathLike[str] | None,
    say: Callable[[str], None] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> list[tuple[DumpTarget, StackDump]]:
    """Each target's stacks, one after the other: the ranks share the trainer log that
    faulthandler writes to, and one block at a time keeps each rank's block whole."""
    out = []
    for i, t in enumerate(targets):
        if say is not None:
            say(f"rank {t.rank} (pid {t.pid}): reading its stacks ({i + 1} of {len(targets)})")
        out.append((t, dump_stacks(t.pid, log_path, t.instrumented, timeout)))
    return out


# CAP_SYS_PTRACE's bit in /proc/<pid>/status CapEff (linux/capability.h).
CAP_SYS_PTRACE = 19


class PtraceAccess(msgspec.Struct, kw_only=True, frozen=True):
    """Whether py-spy, run from here, may read a trainer of the same user (what `dump` needs for
    an uninstrumented trainer or a stopped one)."""

    py_spy: str | None  # its path; None: not installed
    scope: int | None  # kernel.yama.ptrace_scope; None: no Yama, plain same-user rules
    cap_sys_ptrace: bool
    allowed: bool
    reason: str


def ptrace_access(proc_root: str = "/proc", py_spy: str | None = None) -> PtraceAccess:
    """py-spy's path (PATH lookup unless given) and the ptrace rights this process has.

    Yama's scope: 0 any same-user process; 1 only descendants (py-spy is not the trainer's
    ancestor), so CAP_SYS_PTRACE is needed; 2 only with CAP_SYS_PTRACE; 3 never, root included.
    """
    path = py_spy if py_spy is not None else py_spy_path()
    scope = _read_int(Path(proc_root, "sys", "kernel", "yama", "ptrace_scope"))
    cap = _has_cap(Path(proc_root, "self", "status"), CAP_SYS_PTRACE)
    if scope == 3:
        allowed, reason = False, "kernel.yama.ptrace_scope=3: no process may ptrace another until reboot"
    elif cap:
        allowed, reason = True, "this process has CAP_SYS_PTRACE"
    elif scope in (None, 0):
        allowed = True
        reason = "same-user ptrace is allowed" + (" (no Yama)" if scope is None else " (ptrace_scope=0)")
    else:
        why = "only a descendant" if scope == 1 else "only CAP_SYS_PTRACE"
        allowed, reason = False, f"kernel.yama.ptrace_scope={scope}: {why} may ptrace, and py-spy is neither"
    return PtraceAccess(py_spy=path, scope=scope, cap_sys_ptrace=cap, allowed=allowed, reason=reason)


def py_spy_path() -> str | None:
    """py-spy on PATH, else beside this interpreter: the default install brings it into the
    environment trainroom runs from, which need not be activated (a venv's bin/trainroom)."""
    import shutil
    import sys

    found = shutil.which("py-spy")
    if found is None:
        beside = Path(sys.executable).parent / "py-spy"
        found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None
    return found


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _has_cap(status: Path, bit: int) -> bool:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


_HEADER = re.compile(r"^(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+.*|Stack) \(most recent call first\):$")
_FRAME = re.compile(r"^  (?:File |<no Python frame>|\.\.\.)")


def dump_stacks(
    pid: int,
    log_path: str | os.PathLike[str] | None,
    instrumented: bool,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    proc_root: str = "/proc",
) -> StackDump:
    """Every thread's stack of `pid`, by faulthandler (SIGUSR1, when the trainer registered it and
    runs) or py-spy; never raises.

    Blocking for up to `timeout` (plus py-spy's run): call it from a worker thread.
    """
    state: str
    try:
        state = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return _result(False, "", None, f"pid {pid} is not running")
    except psutil.AccessDenied:
        state = "unknown"
    if state == psutil.STATUS_ZOMBIE:
        return _result(False, "", None, f"pid {pid} has exited (a zombie): no stacks to take")
    stopped = state in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)

    notes: list[str] = []
    if instrumented and log_path is not None:
        if stopped:
            notes.append(
                f"pid {pid} is stopped (SIGSTOP): SIGUSR1 would wait until `kill -CONT {pid}`, so faulthandler cannot answer"
            )
        elif not catches_signal(pid, signal.SIGUSR1, proc_root):
            notes.append(
                f"pid {pid} does not catch SIGUSR1 (faulthandler not registered): not sent, since it would kill the trainer"
            )
        else:
            text = _faulthandler_dump(pid, Path(log_path), timeout)
            if text:
                threads = sum(1 for line in text.splitlines() if _HEADER.match(line))
                return _result(
                    True,
                    text,
                    "faulthandler",
                    f"{threads} thread(s) dumped by faulthandler (SIGUSR1) from {log_path}",
                )
            notes.append(f"no faulthandler dump appeared in {log_path} within {timeout:g} s")

    # A stopped process cannot be paused again (py-spy's default), but it holds still: read it
    # without pausing, which is exact while it stays stopped.
    spied = _py_spy(pid, timeout=max(timeout, 10.0), nonblocking=stopped)
    if stopped:
        return _stopped(pid, state, spied)
    spied.message = "; ".join([*notes, spied.message])
    return spied


def _stopped(pid: int, state: str, spied: StackDump) -> StackDump:
    """A stopped process's answer: it is stopped, and its stacks where it stopped when py-spy
    could read them (or why not); a continue is what lets it run."""
    why = "being traced by a debugger" if state == psutil.STATUS_TRACING_STOP else "SIGSTOP"
    said = f"pid {pid} is stopped ({why}): it runs no code until SIGCONT; continue (U) lets it run on"
    if spied.ok:
        out = _result(True, spied.text, spied.method, f"{said}; its stacks where it stopped, {spied.message}")
    else:
        out = _result(True, "", None, f"{said}; its stacks could not be read ({spied.message})")
    out.stopped = True
    return out


def catches_signal(pid: int, sig: int, proc_root: str = "/proc") -> bool:
    """Whether the process has a handler installed for `sig` (its SigCgt mask)."""
    try:
        for line in Path(proc_root, str(pid), "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def extract_dump(text: str) -> tuple[str, bool]:
    """The first faulthandler block in `text` and whether something other than the dump follows
    it (which tells the dump is complete). Log lines before the block are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _HEADER.match(line)), None)
    if start is None:
        return "", False
    end = start
    ended = False
    for i in range(start, len(lines)):
        line = lines[i]
        if _HEADER.match(line) or _FRAME.match(line):
            end = i
        elif line.strip() == "":
            continue
        else:
            ended = True
            break
    return "\n".join(lines[start : end + 1]) + "\n", ended


def _faulthandler_dump(pid: int, log: Path, timeout: float) -> str:
    try:
        offset = log.stat().st_size
    except OSError:
        offset = 0
    try:
        send_to_side_thread(pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ""
    deadline = time.monotonic() + timeout
    last_size, quiet_since, text = -1, time.monotonic(), ""
    while time.monotonic() < deadline:
        try:
            with log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        now = time.monotonic()
        if len(chunk) != last_size:
            last_size, quiet_since = len(chunk), now
        text, ended = extract_dump(chunk.decode(errors="replace"))
        if text and (ended or now - quiet_since >= QUIET_S):
            return text
        time.sleep(POLL_S)
    return text


def send_to_side_thread(pid: int, sig: int, proc_root: str = "/proc") -> int:
    """Send `sig` to a thread of `pid` other than its main thread, one that does not block it;
    to the process when there is none (or no tgkill). Returns the tid it went to (pid: the
    process). Raises ProcessLookupError when the process is gone."""
    tgkill = _tgkill()
    if tgkill is not None:
        for tid in _side_threads(pid, sig, proc_root):
            if tgkill(pid, tid, sig) == 0:
                return tid
            # The thread ended meanwhile (ESRCH): the next one.
    os.kill(pid, sig)
    return pid


def _side_threads(pid: int, sig: int, proc_root: str) -> list[int]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc_root}/{pid}/task") if t.isdigit() and int(t) != pid)
    except OSError:
        return []
    out = []
    for tid in tids:
        try:
            status = Path(proc_root, str(pid), "task", str(tid), "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            blocked = int(fields.get("SigBlk", "0").strip(), 16) >> (sig - 1) & 1
        except ValueError:
            continue
        if not blocked and not fields.get("State", "").strip().startswith(("Z", "X")):
            out.append(tid)
    return out


def _tgkill() -> Any:
    """libc's tgkill (glibc >= 2.30, musl), or None."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).tgkill
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _py_spy(pid: int, timeout: float, nonblocking: bool = False) -> StackDump:
    import sh  # external commands go through sh

    from trainroom.core.logs.logformats import ANSI  # the log reader's pattern, here only

    path = py_spy_path()
    if path is None:
        return _result(False, "", None, PY_SPY_INSTALL)
    try:
        py_spy = sh.Command(path)
    except sh.CommandNotFound:
        return _result(False, "", None, PY_SPY_INSTALL)
    try:
        # Full file names, as faulthandler writes them: a frame in an installed package is told
        # from the trainer's own by its path (py-spy shortens `…/site-packages/torch/x.py` to
        # `torch/x.py` by default), so both dumps of one place read alike.
        flags = ["--full-filenames", *(["--nonblocking"] if nonblocking else [])]
        # sh gives a command a terminal for its stdout by default: py-spy then colours its lines.
        out = py_spy("dump", *flags, "--pid", str(pid), _timeout=timeout, _tty_out=False)
    except sh.ErrorReturnCode as exc:
        err = exc.stderr.decode(errors="replace").strip().splitlines() or [f"exit code {exc.exit_code}"]
        return _result(False, "", None, f"py-spy dump --pid {pid} failed: {err[-1]}")
    except sh.TimeoutException:
        return _result(False, "", None, f"py-spy dump --pid {pid} gave no answer in {timeout:g} s")
    text = ANSI.sub("", str(out))  # a CLICOLOR_FORCE in the keeper's environment colours it anyway
    how = " without pausing it (it is stopped)" if nonblocking else ""
    return _result(True, text, "py-spy", f"stacks of pid {pid} read by py-spy{how}")


def _result(ok: bool, text: str, method: DumpMethod | None, message: str) -> StackDump:
    return StackDump(ok=ok, text=text, method=method, message=message)
