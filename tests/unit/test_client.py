"""The client against keepers that misbehave from its side of the socket: one that resets the
connection (what a keeper does to a peer of another uid), one that never answers (busy)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainroom.core.cli.main import main
from trainroom.core.run.client import KeeperBusy, KeeperClient, KeeperGone


@pytest.fixture
def resetting_keeper(tmp_path: Path) -> Iterator[str]:
    """Accepts, then closes with a reset: the keeper's answer to a peer of another uid."""
    path = str(tmp_path / "k.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.recv(1 << 16)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path
    stop.set()
    srv.close()


def test_a_reset_is_keeper_gone_with_words_not_a_connection_error(resetting_keeper: str) -> None:
    c = KeeperClient(resetting_keeper, timeout_s=5)
    with pytest.raises(KeeperGone, match=r"refused or dropped|closed the connection"):
        c.call("kill", {}, confirm=False)


def test_a_keeper_that_never_answers_is_busy(tmp_path: Path) -> None:
    path = str(tmp_path / "k.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)  # never accepts, never answers: a stopped keeper
    try:
        with pytest.raises(KeeperBusy):
            KeeperClient(path, timeout_s=0.5).subscribe(live=False)
    finally:
        srv.close()


def test_the_cli_turns_an_unusable_state_dir_into_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / "runs").parent.mkdir(parents=True)
    (home / "runs").write_text("a file where the runs dir should be")
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    assert main(["runs"]) in (0, 2)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1
