"""A real OpenSSH server on 127.0.0.1 for the tests' second "node": its own free port, a
throwaway host key, user key, authorized_keys and config in a temp dir. Clients reach it through
TRAINROOM_SSH_COMMAND (the user key, a known_hosts holding the host key, nothing from ~/.ssh).

Skipped with one line where it cannot work: no sshd binary, no ssh client, or sshd refusing to
start (its own words are the reason)."""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


@dataclass
class Sshd:
    port: int
    dir: Path
    proc: subprocess.Popen[bytes]
    ssh_command: str  # what TRAINROOM_SSH_COMMAND is set to
    user: str

    def target(self, run: str | None = None) -> str:
        base = f"ssh://{self.user}@127.0.0.1:{self.port}"
        return f"{base}/{run}" if run else base

    def sessions(self) -> list[psutil.Process]:
        """The per-connection sshd children (one per live ssh link)."""
        try:
            return psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []

    def drop_links(self) -> int:
        """Kill every per-connection child: each link drops as if the network went away."""
        n = 0
        for child in self.sessions():
            try:
                child.kill()
                n += 1
            except psutil.Error:
                pass
        return n


def remote_command(home: Path) -> str:
    """The remote trainroom: this venv's, with the remote node's TRAINROOM_HOME (and this
    process's PYTHONPATH, where the tests run a checkout that is not the installed one)."""
    path = os.environ.get("PYTHONPATH")
    where = f" PYTHONPATH={shlex.quote(path)}" if path else ""
    return (
        f"env TRAINROOM_HOME={shlex.quote(str(home))}{where} {shlex.quote(sys.executable)} -m trainroom.cli"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, capture_output=True
    )


def start_sshd() -> Iterator[Sshd]:
    sshd = next((c for c in SSHD_CANDIDATES if os.access(c, os.X_OK)), None)
    if sshd is None:
        pytest.skip("no sshd binary (Debian: apt-get install openssh-server)")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("no ssh client (Debian: apt-get install openssh-client)")
    d = Path(tempfile.mkdtemp(prefix="trsshd", dir="/tmp"))
    user = getpass.getuser()
    _keygen(d / "host_key")
    _keygen(d / "user_key")
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = _free_port()
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    (d / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {d / 'host_key'}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                f"AllowUsers {user}",
                "StrictModes no",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    # sshd wants its privilege separation dir; a root test may make it (Debian's package does).
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = open(d / "sshd.log", "wb")  # noqa: SIM115 - held for the server's whole life
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)

    def listening() -> bool:
        if proc.poll() is not None:
            return True
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout=20, what="sshd listening")
    if proc.poll() is not None:
        words = (d / "sshd.log").read_text(errors="replace").strip().splitlines()
        shutil.rmtree(d, ignore_errors=True)
        pytest.skip(f"sshd would not start: {words[-1] if words else f'exit {proc.returncode}'}")
    ssh_command = " ".join(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            shlex.quote(str(d / "user_key")),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={shlex.quote(str(d / 'known_hosts'))}",
            "-o",
            "StrictHostKeyChecking=yes",
        ]
    )
    try:
        yield Sshd(port=port, dir=d, proc=proc, ssh_command=ssh_command, user=user)
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
            try:
                child.kill()
            except psutil.Error:
                pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)
