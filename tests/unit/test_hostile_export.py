"""`trainroom export` with hundreds of idle loopback connections under a low fd limit: the
exporter holds at most a quarter of its fds as connections, closes the oldest idle one to make
room and any that stays silent past its idle timeout, so a scrape still gets the exposition (which
promtool still checks). Before, a thread per connection and no idle timeout: accept() hit the fd
limit and every scrape waited."""

from __future__ import annotations

import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

IDLE = 300  # connections opened and left silent; the exporter's fd limit is 128


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))


def test_hundreds_of_idle_connections_never_block_a_scrape(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainroom.cli", "export", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TRAINROOM_HOME": str(home)},
        preexec_fn=_limit,
    )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m, line + (proc.stderr.read() if proc.stderr else "")
        port = int(m.group(1))
        for _ in range(IDLE):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            held.append(s)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
        assert "trainroom_" in body
        promtool = shutil.which("promtool")
        if promtool is None:
            pytest.skip("promtool is not installed: the exposition was served, not checked")
        check = subprocess.run(
            [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        for s in held:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)
