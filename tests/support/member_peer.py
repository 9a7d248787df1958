"""A peer on a keeper's socket that is a process of the run: the keeper takes a Hello only from a
process whose environment names the run and its live attempt (as every process the attempt
starts inherits). A test that plays a reporter by hand speaks through one of these: a child
started with that environment, relaying the test's bytes to the socket."""

from __future__ import annotations

import os
import subprocess
import sys

from trainroom.core.run import store as runs

RELAY = r"""
import os, socket, sys, threading, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
print(os.getpid(), flush=True)
closed = threading.Event()
def watch():
    try:
        while s.recv(1 << 16):
            pass
    except OSError:
        pass
    closed.set()
threading.Thread(target=watch, daemon=True).start()
try:
    while chunk := sys.stdin.buffer.read1(1 << 16):
        s.sendall(chunk)
except OSError:
    pass
print("closed" if closed.wait(float(sys.argv[2])) else "open", flush=True)
time.sleep(600)  # alive until close(): a claim is a finding only while its claimant lives
"""


class MemberPeer:
    """A connection from a child process of run `info`'s attempt `attempt`; `pid` is what its
    Hello must say."""

    def __init__(self, info: runs.RunInfo, attempt: int = 1, wait_s: float = 10.0) -> None:
        env = dict(os.environ, TRAINROOM_RUN=info.run_id, TRAINROOM_ATTEMPT=str(attempt))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RELAY, info.sock, str(wait_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def closed_by_keeper(self) -> bool:
        """Stop sending and say whether the keeper closed the connection (within the wait)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        return self.proc.stdout.readline().strip() == b"closed"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
