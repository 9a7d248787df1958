"""The ssh side of a remote keeper: OpenSSH as a subprocess whose stdio is one end of a socket
pair, so the caller holds an ordinary stream socket (what `KeeperClient` reads) and the remote
`trainroom bridge` relays it to the keeper's Unix socket there.

`TRAINROOM_SSH_COMMAND` replaces `ssh` (split like a shell, as `GIT_SSH_COMMAND`; its own `-o`
options win over ours, since ssh takes the first value given); `TRAINROOM_REMOTE_COMMAND` (or
the host's `remote_command` in trainroom.toml) replaces the remote `trainroom`. BatchMode is on,
so a host that wants a password is an error, never a prompt that hangs.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading

from trainroom.core.remote.target import SshTarget
from trainroom.core.remote.wire import BridgeHello, read_hello
from trainroom.core.wire import protocol as p

ENV_SSH_COMMAND = "TRAINROOM_SSH_COMMAND"
ENV_REMOTE_COMMAND = "TRAINROOM_REMOTE_COMMAND"
CONNECT_TIMEOUT_S = 10
# A link that stops answering is noticed within ServerAliveInterval × CountMax (15 s), even when
# no keeper frame is due.
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    f"ConnectTimeout={CONNECT_TIMEOUT_S}",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "LogLevel=ERROR",
)
HELLO_MAX = 1 << 16
EXIT_SSH_FAILED = 255  # ssh's own failure (no connection, refused key), not the remote command's


class Unreachable(Exception):
    """The host could not be reached, or the link dropped: never a verdict on the run."""


class RemoteRefused(Exception):
    """The remote end answered and said no (no such run, no trainroom there): one line."""


def ssh_command() -> list[str]:
    raw = os.environ.get(ENV_SSH_COMMAND) or "ssh"
    try:
        words = shlex.split(raw)
    except ValueError as exc:
        raise RemoteRefused(f"{ENV_SSH_COMMAND}: cannot split {raw!r}: {exc}") from None
    if not words:
        raise RemoteRefused(f"{ENV_SSH_COMMAND} is empty")
    return words


def remote_command(target: SshTarget) -> str:
    return target.remote_command or os.environ.get(ENV_REMOTE_COMMAND) or "trainroom"


def ssh_argv(target: SshTarget, remote_args: list[str], *, tty: bool = False) -> list[str]:
    """ssh's argv running `trainroom REMOTE_ARGS` on the target; the remote shell joins the words,
    so each of ours is quoted (the remote command itself is the user's, taken as written)."""
    port = ["-p", str(target.port)] if target.port is not None else []
    line = " ".join([remote_command(target), *(shlex.quote(a) for a in remote_args)])
    return [*ssh_command(), *SSH_OPTIONS, "-t" if tty else "-T", *port, target.destination, line]


class BridgeSocket(socket.socket):
    """Our end of the socket pair; closing it lets ssh see EOF and go, reaped off-thread."""

    ssh: subprocess.Popen[bytes] | None = None

    def link_dropped(self, wait_s: float = 2.0) -> bool:
        """After EOF: whether the link dropped (ssh failed or was killed) rather than the bridge
        ending because the keeper closed (the bridge exits 0 then, ssh with it)."""
        proc = self.ssh
        if proc is None:
            return False
        try:
            rc = proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return True  # ssh still holds on after the stream ended: the link, not the keeper
        return rc == EXIT_SSH_FAILED or rc < 0

    def close(self) -> None:
        super().close()
        proc, self.ssh = self.ssh, None
        if proc is not None:
            threading.Thread(target=_reap, args=(proc,), name="trainroom-ssh-reap", daemon=True).start()


def _reap(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def dial(
    target: SshTarget, *, job: str | None = None, timeout_s: float | None = CONNECT_TIMEOUT_S + 5
) -> tuple[BridgeSocket, BridgeHello]:
    """Start `trainroom bridge [RUN] [--job NAME]` on the target; return our end of the link and
    the bridge's hello. Raises Unreachable (ssh failed, or the link dropped before the hello) or
    RemoteRefused (the remote end said why it cannot serve)."""
    args = ["bridge", *([target.run] if target.run else []), *(["--job", job] if job else [])]
    argv = ssh_argv(target, args)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=theirs.fileno(),
            stdout=theirs.fileno(),
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        mine.close()
        raise RemoteRefused(
            f"cannot run {argv[0]!r}: {exc.strerror or exc} (see {ENV_SSH_COMMAND})"
        ) from None
    finally:
        theirs.close()
    sock = BridgeSocket(fileno=mine.detach())
    sock.ssh = proc
    try:
        sock.settimeout(timeout_s)
        hello = _read_hello(sock)
    except (OSError, ValueError) as exc:
        sock.ssh = None  # _why reaps it, after reading its last words
        sock.close()
        raise _why(target, proc, exc) from None
    if not hello.ok:
        sock.close()
        raise RemoteRefused(f"{target.node}: {hello.error}")
    return sock, hello


def _read_hello(sock: socket.socket) -> BridgeHello:
    head = _read_exactly(sock, p.HEADER.size)
    (n,) = p.HEADER.unpack(head)
    if n > HELLO_MAX:
        raise ValueError(f"the remote end sent {n} bytes where a bridge hello was expected")
    try:
        return read_hello(_read_exactly(sock, n))
    except Exception as exc:  # msgspec's decode errors: a different program answered
        raise ValueError(f"the remote end sent no bridge hello ({exc})") from None


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the link closed before the bridge said hello")
        buf += chunk
    return bytes(buf)


def _why(target: SshTarget, proc: subprocess.Popen[bytes], exc: BaseException) -> Exception:
    """ssh's own words for a failed dial: unreachable when ssh failed, refused when the remote
    command did (exit 127: no trainroom there)."""
    try:
        rc = proc.wait(3.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    err = ""
    if proc.stderr is not None:
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else (str(exc) or type(exc).__name__)
    if rc == EXIT_SSH_FAILED or rc < 0 or isinstance(exc, TimeoutError):
        return Unreachable(f"{target.node} unreachable: {last}")
    hint = (
        f" (the remote command is {remote_command(target)!r}: set {ENV_REMOTE_COMMAND})" if rc == 127 else ""
    )
    return RemoteRefused(f"{target.node}: {last}{hint}")


def hello(target: SshTarget, *, job: str | None = None) -> BridgeHello:
    """Resolve the target's run on its host (one ssh round trip) without relaying anything."""
    sock, said = dial(target, job=job)
    sock.close()
    return said


def fetch_snapshot(target: SshTarget, *, job: str | None = None) -> tuple[BridgeHello, p.Snapshot]:
    """The bridge's hello and the run's snapshot through it: its keeper's, or (keeper gone) its
    journal's. One ssh round trip."""
    sock, said = dial(target, job=job)
    try:
        sock.sendall(p.frame(p.Subscribe(client="status", live=False)))
        reader = p.FrameReader(p.keeper_decoder, p.MAX_OUTBOUND_FRAME)
        while True:
            data = sock.recv(1 << 20)
            if not data:
                raise Unreachable(f"{target}: the link closed before the run's state came")
            for msg in reader.feed(data):
                if isinstance(msg, p.Snapshot):
                    return said, msg
    except (OSError, p.ProtocolError) as exc:
        raise Unreachable(f"{target}: {exc}") from None
    finally:
        sock.close()


def run_remote(target: SshTarget, remote_args: list[str], *, tty: bool) -> int:
    """Run `trainroom REMOTE_ARGS` on the target with this terminal's stdio (for a command whose
    work is on that host's files, its keeper being gone); ssh's exit code, 255 when unreachable."""
    return subprocess.call(ssh_argv(target, remote_args, tty=tty))
