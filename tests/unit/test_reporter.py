"""The reporter never blocks the loop, drops the oldest when the keeper stalls, and is a no-op
outside a keeper."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from tests.support.waiting import wait_for
from trainroom.core.sdk import reporter as reporter
from trainroom.core.wire import protocol as p


def test_connect_without_a_keeper_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    rep = reporter.connect(lr=1e-3)
    assert not rep.active
    rep.step(1, loss=1.0)
    with rep.phase("eval"):
        pass
    rep.close()
    assert reporter.current() is rep


class _Listener:
    """A bare socket server that can stop reading (a stalled keeper) and collect frames."""

    def __init__(self, path: str) -> None:
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(4)
        self.frames: list[object] = []
        self.reading = threading.Event()
        self.reading.set()
        self.conns = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.conns += 1
            threading.Thread(target=self._read, args=(c,), daemon=True).start()

    def _read(self, c: socket.socket) -> None:
        r = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
        while True:
            self.reading.wait()
            data = c.recv(1 << 16)
            if not data:
                return
            self.frames += r.feed(data)


def test_a_stalled_keeper_never_blocks_and_the_oldest_frames_are_dropped(tmp_path: Path) -> None:
    path = str(tmp_path / "k.sock")
    lis = _Listener(path)
    lis.reading.clear()  # the keeper stops reading
    rep = reporter.Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=3600)
    # Until the socket buffer and the bounded queue are full (steps go out in coalesced sends, so
    # the buffer holds many), then as many again: every call returns at once.
    n = 0
    while rep.dropped == 0 and n < reporter.QUEUE_FRAMES * 256:
        rep.step(n, loss=1.0, lr=[1e-3] * 8)
        n += 1
    for i in range(n, n + reporter.QUEUE_FRAMES):
        rep.step(i, loss=1.0, lr=[1e-3] * 8)
    n += reporter.QUEUE_FRAMES
    # Everything fit in the socket buffer or the bounded queue; the rest was dropped, counted.
    assert rep.dropped > 0
    assert len(rep._queue) <= reporter.QUEUE_FRAMES
    lis.reading.set()
    rep.flush(timeout_s=5)
    steps = wait_for(lambda: [f.step for f in lis.frames if isinstance(f, p.Step)], timeout=5)
    wait_for(
        lambda: len([f for f in lis.frames if isinstance(f, p.Step)]) + rep.dropped >= n,
        timeout=5,
        what="every step either delivered or counted as dropped",
    )
    steps = [f.step for f in lis.frames if isinstance(f, p.Step)]
    assert steps == sorted(steps)  # no frame torn, none reordered
    assert steps[-1] == n - 1  # the newest survive; the oldest were dropped
    assert isinstance(lis.frames[0], p.Hello)
    rep.close()


def test_reconnects_quietly_and_says_hello_again(tmp_path: Path) -> None:
    path = str(tmp_path / "k.sock")
    rep = reporter.Reporter(path, p.Hello(pid=os.getpid(), rank=3), heartbeat_s=0.05)
    rep.step(1, loss=1.0)  # no keeper yet: queued, nothing raised
    lis = _Listener(path)
    wait_for(lambda: any(isinstance(f, p.Step) for f in lis.frames), timeout=5, what="reconnect")
    assert isinstance(lis.frames[0], p.Hello) and lis.frames[0].rank == 3
    hb = wait_for(lambda: [f for f in lis.frames if isinstance(f, p.Heartbeat)], timeout=5)
    assert hb[0].main_frame and ":" in hb[0].main_frame
    rep.close()


def test_uncaught_exception_sends_the_whole_chain_and_sigusr1_dumps_stacks(tmp_path: Path) -> None:
    path = str(tmp_path / "k.sock")
    lis = _Listener(path)
    code = textwrap.dedent("""
        import errno, os, signal, sys, time
        from trainroom.core import sdk
        rep = sdk.connect(lr=1e-3)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
        try:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        except OSError as e:
            raise SystemError("readinto") from e
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, TRAINROOM_SOCKET=path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert "Current thread" in out.stderr or "Thread 0x" in out.stderr  # faulthandler's dump
    crash = wait_for(lambda: [f for f in lis.frames if isinstance(f, p.Crash)], timeout=5, what="crash")[0]
    assert [link.type for link in crash.chain] == ["SystemError", "OSError"]
    assert crash.chain[-1].errno == 12 and crash.chain[-1].errno_name == "ENOMEM"
    assert "readinto" in crash.traceback


def test_a_keeper_that_vanishes_mid_stream_never_raises_into_the_loop(tmp_path: Path) -> None:
    path = str(tmp_path / "k.sock")
    lis = _Listener(path)
    rep = reporter.Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=3600)
    rep.step(1)
    wait_for(lambda: lis.conns == 1, timeout=5)
    lis.srv.close()
    os.unlink(path)
    for i in range(2, 200):
        rep.step(i)  # must neither raise nor block
    rep.step(-5)  # a step the keeper would refuse: dropped and counted, not raised
    assert rep.invalid == 1


def test_a_step_held_for_the_send_window_goes_out_without_another_step(tmp_path: Path) -> None:
    """With a send window, steps closer than it share a send; the last one before the loop stops (a
    hang, a long evaluation) is sent by the heartbeat thread after the window, not at the next
    heartbeat."""
    path = str(tmp_path / "k.sock")
    lis = _Listener(path)
    rep = reporter.Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=3600, send_window_s=reporter.HOLD_S)
    try:
        for i in range(1, 6):
            rep.step(i, loss=float(i))  # the first goes at once, the rest wait for the window
        steps = wait_for(
            lambda: [f.step for f in lis.frames if isinstance(f, p.Step)] == [1, 2, 3, 4, 5] or None,
            timeout=5,
            what="the held steps, sent by the heartbeat thread",
        )
        assert steps and rep.dropped == 0
        # Non-finite values are the keeper's to judge: they travel as they are.
        rep.step(6, loss=float("nan"))
        wait_for(lambda: any(isinstance(f, p.Step) and f.step == 6 for f in lis.frames), timeout=5)
        (six,) = [f for f in lis.frames if isinstance(f, p.Step) and f.step == 6]
        assert six.loss != six.loss
    finally:
        rep.close()


def test_without_a_window_each_step_is_sent_at_once(tmp_path: Path) -> None:
    """The default: a loop stopped (SIGSTOP, SIGKILL) right after a step has already sent it; no
    step waits for the heartbeat thread (here an hour away)."""
    path = str(tmp_path / "k.sock")
    lis = _Listener(path)
    rep = reporter.Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=3600, send_window_s=0)
    try:
        for i in range(1, 6):
            rep.step(i, loss=float(i))
            assert not rep._held  # nothing waits for a window
        wait_for(
            lambda: [f.step for f in lis.frames if isinstance(f, p.Step)] == [1, 2, 3, 4, 5] or None,
            timeout=5,
            what="every step, each sent at once",
        )
    finally:
        rep.close()
