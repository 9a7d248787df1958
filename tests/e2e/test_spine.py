"""The spine end to end: real keeper, real trainer processes, real sockets, real signals."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.helpers import run_cli, start_demo, status, status_json
from tests.support.waiting import wait_for
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.wire import protocol


def _journal(info: runs.RunInfo) -> list[object]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _closed_reasons(info: runs.RunInfo) -> list[str]:
    return [r.reason for r in _journal(info) if isinstance(r, protocol.ConnectionClosed)]


def test_demo_steps_arrive_and_clean_exit_is_exited(trhome: Path) -> None:
    info = start_demo(steps=40, ckpt_every=0)
    d = wait_for(lambda: (s := status(info))["state"] == "exited" and s, timeout=60, what="exited")
    assert d["exit"] == {"code": 0, "signal": None, "signal_name": None}
    assert d["step"] == 40
    assert d["instrumented"] is True
    assert isinstance(d["loss"], float) and d["loss"] > 0
    assert d["lr"]["requested"] == pytest.approx(3e-3)
    assert d["lr"]["effective"] == [pytest.approx(3e-3)]
    assert d["vocab_size"] and d["vocab_size"] > 20
    assert "DEAD" not in {f["code"] for f in d["findings"]}


def test_kill_9_gives_dead_with_signal_and_last_step(trhome: Path) -> None:
    info = start_demo(step_delay=0.02, ckpt_every=0)
    d = wait_for(lambda: (s := status(info))["step"] and s["step"] >= 5 and s, timeout=60, what="steps")
    os.kill(d["pid"], signal.SIGKILL)
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=10, what="dead")
    assert d["exit"]["signal"] == 9 and d["exit"]["signal_name"] == "SIGKILL"
    assert d["exit"]["code"] is None
    assert d["step"] >= 5
    # The CLI prints the same through its JSON contract.
    j = status_json(info.run_id)
    assert j["state"] == "dead" and j["exit"]["signal"] == 9 and j["step"] == d["step"]
    for key in (
        "run",
        "state",
        "attempt",
        "pid",
        "pgid",
        "exit",
        "step",
        "step_age_s",
        "steps_per_s",
        "loss",
        "lr",
        "vram",
        "host",
        "disk",
        "checkpoints",
        "findings",
    ):
        assert key in j
    assert set(j["vram"]) >= {
        "driver_used_bytes",
        "driver_total_bytes",
        "allocator_allocated_bytes",
        "allocator_reserved_bytes",
    }


def test_reopening_a_client_loses_no_steps(trhome: Path) -> None:
    info = start_demo(steps=150, step_delay=0.005, ckpt_every=0)
    c = KeeperClient(info.sock)
    st = c.subscribe(client="test")
    seen = st.steps_total
    for batch in c.records(timeout_s=30):
        for rec in batch:
            st.apply(rec)
        if st.steps_total >= 20:
            break
    c.close()
    time.sleep(0.3)  # steps keep coming while no client is connected
    wait_for(lambda: status(info)["state"] == "exited", timeout=60, what="exit")
    st2 = KeeperClient(info.sock).subscribe(client="test-again", live=False)
    assert st2.steps_total == 150 and st2.steps_total > seen
    steps = [
        r.msg.step
        for r in _journal(info)
        if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Step)
    ]
    assert steps == list(range(1, 151))


def test_uninstrumented_nanogpt_lines_give_step_and_loss(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import time
        for i in range(0, 60, 10):
            print(f"iter {i}: loss {4.0 - i / 100:.4f}, time 12.34ms, mfu 30.00%", flush=True)
            time.sleep(0.05)
        time.sleep(30)
    """)
    )
    out = run_cli("launch", "--", sys.executable, str(script), "--learning_rate=6e-4")
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    d = wait_for(lambda: (s := status_json(run_id))["step"] == 50 and s, timeout=30, what="step 50")
    assert d["loss"] == pytest.approx(3.5)
    assert d["instrumented"] is False
    assert d["state"] in ("running", "starting", "slow")


def test_launch_returns_while_the_keeper_lives_on(trhome: Path) -> None:
    # `run=$(trainroom launch ...)` must not wait for the keeper: every stream is detached.
    proc = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "launch", "--", "sleep", "30"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    d = status_json(proc.stdout.strip())
    assert d["keeper"] == "alive" and d["state"] in ("starting", "running")
    # The trainer is the leader of its own process group, not in ours.
    assert d["pgid"] == d["pid"] and d["pgid"] != os.getpgid(0)


@pytest.mark.parametrize(
    "args, expect",
    [
        (["launch", "--", "no-such-command-xyz"], "command not found: no-such-command-xyz"),
        (["launch"], "launch needs a command"),
        (["status", "nope-not-a-run"], "unknown run 'nope-not-a-run'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(trhome: Path, args: list[str], expect: str) -> None:
    out = run_cli(*args)
    assert out.returncode == 2
    assert expect in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_unwritable_state_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    env = dict(os.environ, TRAINROOM_HOME=str(blocker / "home"))
    out = run_cli("launch", "--", "sleep", "1", env=env)
    assert out.returncode == 2
    assert "not writable" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def _raw(sock_path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(sock_path)
    return s


def _closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_garbage_and_oversized_frames_close_one_connection_only(trhome: Path) -> None:
    info = start_demo(step_delay=0.02, ckpt_every=0)
    wait_for(lambda: (status(info)["step"] or 0) >= 3, timeout=60, what="steps")
    g = _raw(info.sock)
    g.sendall(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
    assert _closed_by_peer(g)
    big = _raw(info.sock)
    big.sendall(struct.pack(">I", 1 << 30))
    assert _closed_by_peer(big)
    wrong = _raw(info.sock)
    wrong.sendall(protocol.frame(protocol.Heartbeat(t=1.0)))  # not hello/subscribe/request first
    assert _closed_by_peer(wrong)
    before = status(info)["step"]
    wait_for(lambda: status(info)["step"] > before, timeout=30, what="the run goes on")
    reasons = wait_for(lambda: len(r := _closed_reasons(info)) >= 3 and r, timeout=5, what="3 journaled")
    assert any("undecodable frame" in r for r in reasons)
    assert any("exceeds the limit" in r for r in reasons)
    assert any("first message was Heartbeat" in r for r in reasons)
    assert status(info)["state"] == "running"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_client_of_another_uid_is_refused(trhome: Path) -> None:
    info = start_demo(step_delay=0.02, ckpt_every=0)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    # Open the way for uid 65534 so the keeper's own SO_PEERCRED check is what refuses it.
    for d in (trhome, trhome / "runs", Path(info.run_dir)):
        os.chmod(d, 0o755)
    os.chmod(info.sock, 0o777)
    code = textwrap.dedent(f"""
        import os, socket
        os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(5)
        s.connect({info.sock!r})
        try:
            s.sendall(b"\\x00\\x00\\x00\\x00")
            print("closed" if s.recv(64) == b"" else "open")
        except (BrokenPipeError, ConnectionResetError):
            print("closed")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "closed"
    wait_for(
        lambda: any("uid 65534 is not the keeper's uid" in r for r in _closed_reasons(info)),
        timeout=5,
        what="the refusal journaled",
    )
    assert status(info)["state"] == "running"


def test_socket_and_dirs_are_private(trhome: Path) -> None:
    info = start_demo(step_delay=0.05, ckpt_every=0)
    assert os.stat(info.sock).st_mode & 0o777 == 0o600
    assert os.stat(info.run_dir).st_mode & 0o777 == 0o700
    assert os.stat(trhome / "runs").st_mode & 0o777 == 0o700


def test_runs_lists_and_status_defaults_to_the_newest(trhome: Path) -> None:
    a = start_demo(steps=5, ckpt_every=0)
    time.sleep(1.1)  # run ids sort by their creation second
    b = start_demo(steps=5, ckpt_every=0)
    out = run_cli("runs")
    assert a.run_id in out.stdout and b.run_id in out.stdout
    wait_for(lambda: status_json(b.run_id)["state"] == "exited", timeout=60, what="exit")
    newest = run_cli("status", "--json")
    assert newest.returncode == 0 and f'"run": "{b.run_id}"' in newest.stdout


def test_the_run_reads_alive_as_soon_as_launch_returns(trhome: Path) -> None:
    # launch returns on the socket; the record must already name the keeper by then, or a
    # reader in between takes a live run for one whose keeper is gone (a CI failure once).
    for _ in range(3):
        info = start_demo(steps=5, ckpt_every=0, linger_s=0.2)
        rec = runs.read_record(Path(info.run_dir))
        assert rec.keeper_pid is not None and rec.keeper_start_time is not None
        assert runs.resolve_run(info.run_id).alive


def test_status_after_the_keeper_is_gone_reads_the_journal(trhome: Path) -> None:
    info = start_demo(steps=20, ckpt_every=0, linger_s=0.5)
    wait_for(lambda: not runs.resolve_run(info.run_id).alive, timeout=60, what="keeper gone")
    d = status_json(info.run_id)
    assert d["keeper"] == "gone" and d["state"] == "exited" and d["step"] == 20
