"""The verifier process: checkpoints verified in a child, so torch never enters the keeper.

    python -m trainroom.core.ckpt FILE [--expect-json JSON] [--no-discover] [--nice N]
        one file; its report as JSON on stdout (exit 0 verified, 1 rejected, 2 bad input)
    python -m trainroom.core.ckpt --serve [--nice N]
        the warm verifier: one request a line on stdin, one reply a line on stdout

`WarmVerifier` keeps one such child with torch imported for the whole run; `verify_in_subprocess`
is the one-shot form. Both turn a death, a timeout or garbage into a deferred failure report,
never an exception. Requests and replies are msgspec Structs, JSON one a line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import msgspec

from trainroom.core.ckpt.formats import first_line
from trainroom.core.ckpt.report import Expected, VerifyReport, decode_expected, failure_report
from trainroom.core.ckpt.verify import verify
from trainroom.core.units import signal_name

# `python -m` this: the package's __main__ runs `main` below.
CHILD_MODULE = "trainroom.core.ckpt"


class VerifierRequest(msgspec.Struct, kw_only=True, frozen=True):
    id: int
    path: str
    expected: Expected | None = None
    discover: bool = True


class VerifierReply(msgspec.Struct, kw_only=True, frozen=True):
    id: int | None  # None: the request could not be read
    report: VerifyReport


def _death_reason(returncode: int, elapsed_s: float, stderr_tail: str) -> str:
    if returncode < 0:
        sig = signal_name(-returncode)
        hint = " (out of memory?)" if sig == "SIGKILL" else ""
        return f"verifier killed by {sig}{hint} after {elapsed_s:.1f} s"
    return f"verifier failed (exit {returncode}): {stderr_tail}".rstrip(": ")


def verify_in_subprocess(
    path: str | os.PathLike[str],
    expected: Expected | None = None,
    timeout: float = 600.0,
    nice: int = 10,
) -> VerifyReport:
    """Verify in a short-lived child (torch stays out of the caller). Blocks up to `timeout`:
    call it from a worker thread. Never raises for a bad checkpoint or a dead verifier."""
    cmd = [sys.executable, "-m", CHILD_MODULE, str(path)]
    if expected is not None:
        cmd += ["--expect-json", msgspec.json.encode(expected).decode()]
    if nice:
        cmd += ["--nice", str(nice)]
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return failure_report(path, f"verifier timed out after {timeout:.0f} s", deferred=True)
    except OSError as exc:
        return failure_report(path, f"verifier could not start: {exc}", deferred=True)
    stderr = cp.stderr.decode("utf-8", "replace")
    if cp.returncode in (0, 1):
        try:
            return msgspec.json.decode(cp.stdout, type=VerifyReport)
        except msgspec.DecodeError:
            text = stderr or cp.stdout.decode("utf-8", "replace")
            return failure_report(path, f"verifier printed no report: {first_line(text)}", deferred=True)
    tail = stderr.strip().splitlines()
    reason = _death_reason(cp.returncode, time.monotonic() - t0, tail[-1] if tail else "")
    return failure_report(path, reason, deferred=cp.returncode != 2)


class WarmVerifier:
    """One verifier process with torch already imported, reused for every checkpoint of a run.

    Starting Python and importing torch costs ~2 s here, 20x the verification of a 400 MB
    checkpoint itself: a keeper that sees a checkpoint every step cannot pay it each time. The
    child (`python -m trainroom.core.ckpt --serve`) reads one request a line and answers one
    report a line. It is started on first use, restarted after it dies (the verdict in flight
    becomes a deferred failure report, never an exception), killed on a timeout, and closed after
    `idle_s` without work so an idle run holds no torch in memory. Thread-safe: one verification
    at a time. Torch never enters the caller's process.
    """

    def __init__(
        self,
        python: str | None = None,
        *,
        nice: int = 10,
        idle_s: float = 300.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.nice = nice
        self.idle_s = idle_s
        self.env = dict(env) if env is not None else None
        self.starts = 0  # processes started: 1 + restarts
        self.served = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._buf = b""
        self._last_used = time.monotonic()
        self._ids = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> subprocess.Popen[bytes]:
        import tempfile

        # The child's stderr, for the last line of a death: open as long as the child lives.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in _stop)
        cmd = [self.python, "-m", CHILD_MODULE, "--serve", "--nice", str(self.nice)]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            close_fds=True,
            env=self.env,
            bufsize=0,
        )
        self._buf = b""
        self.starts += 1
        return self._proc

    def _stderr_tail(self) -> str:
        f = self._stderr
        if f is None:
            return ""
        try:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1] if lines else ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        for f in (proc.stdin, proc.stdout, self._stderr):
            if f is not None:
                with contextlib.suppress(Exception):
                    f.close()
        self._stderr = None

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """One reply line, or None when the deadline passed (EOF raises EOFError)."""
        import select

        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _ask(self, proc: subprocess.Popen[bytes], req: VerifierRequest, timeout: float) -> VerifyReport:
        """Send one request and read its reply; a death, a timeout or garbage is a deferred failure."""
        t0 = time.monotonic()
        try:
            assert proc.stdin is not None
            proc.stdin.write(msgspec.json.encode(req) + b"\n")
            line = self._read_line(proc, t0 + timeout)
        except (EOFError, OSError):
            try:
                rc = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                rc = -signal.SIGKILL
            reason = _death_reason(rc, time.monotonic() - t0, self._stderr_tail())
            self._stop()
            return failure_report(req.path, reason, deferred=rc != 2)
        if line is None:
            self._stop()  # it may be stuck in a read: the next call starts a fresh one
            return failure_report(req.path, f"verifier timed out after {timeout:.0f} s", deferred=True)
        try:
            reply = msgspec.json.decode(line, type=VerifierReply)
        except msgspec.DecodeError as exc:
            self._stop()
            return failure_report(req.path, f"verifier answered garbage ({exc})", deferred=True)
        if reply.id != req.id:
            self._stop()
            return failure_report(req.path, "verifier answered garbage (reply out of step)", deferred=True)
        self.served += 1
        return reply.report

    def warm(self) -> bool:
        """Start the child now if it is not running, without waiting for it: it imports torch
        while the trainer starts, so the first verdict after a save does not pay for it. Never
        blocks on a verification in flight (the child is running then). True if it started one."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                return False
            self._stop()
            try:
                self._start()
            except OSError:
                return False
            self._last_used = time.monotonic()
            return True
        finally:
            self._lock.release()

    def verify(
        self, path: str | os.PathLike[str], expected: Expected | None = None, timeout: float = 600.0
    ) -> VerifyReport:
        """Verify `path` in the warm child; blocks (call it from a worker thread). The first call,
        and the first after a death or an idle close, also pays the child's start."""
        with self._lock:
            self._ids += 1
            req = VerifierRequest(id=self._ids, path=str(path), expected=expected)
            proc = self._proc
            if proc is None or proc.poll() is not None:
                self._stop()
                try:
                    proc = self._start()
                except OSError as exc:
                    return failure_report(path, f"verifier could not start: {exc}", deferred=True)
            try:
                return self._ask(proc, req, timeout)
            finally:
                self._last_used = time.monotonic()

    def close_if_idle(self, now: float | None = None) -> bool:
        """Close the child after `idle_s` without work (never while it verifies)."""
        if self._proc is None or not self._lock.acquire(blocking=False):
            return False
        try:
            now = time.monotonic() if now is None else now
            if self._proc is not None and now - self._last_used >= self.idle_s:
                self._stop()
                return True
            return False
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # EOF: the child leaves by itself
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            self._stop()


# --------------------------------------------------------------------------- the child


def _renice(nice: int) -> None:
    if nice:
        with contextlib.suppress(OSError):
            os.nice(nice)


def serve(nice: int = 0) -> int:
    """The warm child: import torch once, then one request in, one reply out, a line each, until
    stdin closes (the keeper exited or closed it)."""
    import gc

    _renice(nice)
    try:
        import torch  # noqa: F401  (the point of this process: imported once)
    except ImportError as exc:
        print(f"trainroom verify --serve: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    # Replies go to the original stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    decoder = msgspec.json.Decoder(VerifierRequest)
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        req: VerifierRequest | None = None
        try:
            req = decoder.decode(line)
            report = verify(req.path, req.expected, discover=req.discover)
        except Exception as exc:  # one bad request never ends the server
            why = f"verifier error: {type(exc).__name__}: {exc}"
            report = failure_report(req.path if req else "", why, deferred=True)
        reply = VerifierReply(id=req.id if req else None, report=report)
        out.write(msgspec.json.encode(reply) + b"\n")
        gc.collect(1)  # young cycles only: a full collection costs ~0.1 s with torch loaded
    return 0


def main(argv: list[str] | None = None) -> int:
    """The verifier child: `--serve [--nice N]` (the warm one), or one file, its report as JSON on
    stdout (exit 0 verified, 1 rejected, 2 bad input). `trainroom verify` is the command for people."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve"]:
        nice = int(args[2]) if len(args) >= 3 and args[1] == "--nice" else 0
        return serve(nice)
    ap = argparse.ArgumentParser(prog=f"python -m {CHILD_MODULE}", description=main.__doc__)
    ap.add_argument("path", metavar="CHECKPOINT", help="a file, or a checkpoint directory")
    ap.add_argument("--expect-json", metavar="JSON", default=None)
    ap.add_argument("--no-discover", action="store_true")
    ap.add_argument("--nice", type=int, default=0)
    ns = ap.parse_args(args)
    path = Path(ns.path)
    try:
        if not (path.is_file() or path.is_dir()):
            raise ValueError(f"{path}: {'not a file' if path.exists() else 'no such file'}")
        try:
            expected = decode_expected(ns.expect_json)
        except ValueError as exc:
            raise ValueError(f"--expect-json {exc}") from None
        _renice(ns.nice)
        rep = verify(path, expected, discover=not ns.no_discover)
    except ValueError as exc:
        print(f"trainroom verify: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"trainroom verify: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(msgspec.json.encode(rep) + b"\n")
    return 0 if rep.ok else 1
