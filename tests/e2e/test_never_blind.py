"""The keeper never goes blind: a full disk under its state dir, a damaged journal, a busy socket,
hostile or careless peers on the socket. Every test drives a real keeper process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, status
from tests.support.member_peer import MemberPeer
from tests.support.waiting import kill_runs_under, wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_frames, read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, snapshot
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

# An instrumented trainer that never prints (its stdout is a file on the disk we fill) and steps
# until told to stop.
STEPPER = """
    import time
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        time.sleep(0.05)
"""


def _launch_stepper(tmp_path: Path, **options: Any) -> runs.RunInfo:
    script = tmp_path / "stepper.py"
    script.write_text(textwrap.dedent(STEPPER))
    return launch([sys.executable, str(script)], LaunchOptions(linger_s=120, **options), cwd=str(tmp_path))


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _journal(info: runs.RunInfo) -> list[p.Record]:
    return list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def small_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """TRAINROOM_HOME on a 16 MiB tmpfs of its own: a real filesystem this test can fill."""
    home = Path(tempfile.mkdtemp(prefix="trf", dir="/tmp"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(home)], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip() or done.returncode}")
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    try:
        yield home
    finally:
        kill_runs_under(home)
        subprocess.run(["umount", "-l", str(home)], check=False)
        shutil.rmtree(home, ignore_errors=True)


def _fill(path: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == 28, exc  # ENOSPC, nothing else


def test_a_full_state_disk_keeps_the_keeper_watching_and_loses_nothing(
    small_home: Path, tmp_path: Path
) -> None:
    # Checkpoints on another disk than the state dir: the state dir's own finding speaks for it.
    info = _launch_stepper(tmp_path, ckpt_root=str(tmp_path / "ckpt"))
    wait_for(lambda: (status(info)["step"] or 0) >= 5, timeout=60, what="steps")
    filler = small_home / "filler"
    _fill(filler)
    # The keeper says it cannot write, with the errno, and goes on watching from memory.
    d = wait_for(
        lambda: (s := status(info)) and _finding(s, "JOURNAL_WRITE_FAILED") and s,
        timeout=60,
        what="JOURNAL_WRITE_FAILED",
    )
    f = _finding(d, "JOURNAL_WRITE_FAILED")
    assert f is not None and f["evidence"]["errno"] == 28 and "ENOSPC" in f["message"]
    # ... and why: the state dir's disk, with what the journal takes of it.
    low = wait_for(lambda: _finding(status(info), "STATE_DISK_LOW"), timeout=60, what="STATE_DISK_LOW")
    assert low["severity"] == "critical" and "journal takes" in low["message"], low
    steps_while_full = d["step"]
    wait_for(lambda: status(info)["step"] > steps_while_full + 5, timeout=60, what="steps flowing while full")
    # The trainer's death is seen at once, disk or no disk.
    trainer = d["pid"]
    os.kill(trainer, signal.SIGKILL)
    dead = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=30, what="dead")
    assert dead["keeper"] == "alive" and _finding(dead, "DEAD") is not None
    # Space comes back: the backlog is written, the finding clears.
    filler.unlink()
    wait_for(lambda: _finding(status(info), "JOURNAL_WRITE_FAILED") is None, timeout=60, what="cleared")
    recs = _journal(info)
    assert not [r for r in recs if isinstance(r, p.JournalDamaged)], "the journal holds a torn record"
    ended = [r for r in recs if isinstance(r, p.AttemptEnded)]
    assert [e.exit_signal for e in ended] == [signal.SIGKILL]
    raised = [r.finding.code for r in recs if isinstance(r, p.FindingRaised)]
    assert "DEAD" in raised and "JOURNAL_WRITE_FAILED" in raised
    steps = [r.msg.step for r in recs if isinstance(r, p.Received) and isinstance(r.msg, p.Step)]
    assert steps == list(range(1, len(steps) + 1)), "a step record was lost while the disk was full"
    assert len(steps) > steps_while_full + 5


# --------------------------------------------------------------------------- the trainer side

# SIGPIPE at its default (as in a trainer launched from a shell that reset it, or a C++ extension
# that did): a write to a closed socket without MSG_NOSIGNAL kills the process with signal 13.
DEFAULT_SIGPIPE = """
    import os, signal, sys, time
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    out = open(sys.argv[1], "a", buffering=1)
    step = 0
    while not os.path.exists(sys.argv[2]):
        step += 1
        rep.step(step, loss=2.0)
        out.write(f"step {step}\\n")
        time.sleep(0.02)
    out.write("done\\n")
"""


def test_the_reporter_never_kills_blocks_or_raises_whatever_the_keeper_does(
    trhome: Path, tmp_path: Path
) -> None:
    """Keeper stopped, then killed, then its socket gone: the trainer (SIGPIPE at SIG_DFL) steps on
    and ends on its own."""
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent(DEFAULT_SIGPIPE))
    steps, stop = tmp_path / "steps.log", tmp_path / "stop"
    info = launch(
        [sys.executable, str(script), str(steps), str(stop)], LaunchOptions(linger_s=60), cwd=str(tmp_path)
    )
    rec = runs.read_record(Path(info.run_dir))
    assert rec.keeper_pid is not None

    def count() -> int:
        return (
            sum(1 for line in steps.read_text().splitlines() if line.startswith("step"))
            if steps.exists()
            else 0
        )

    wait_for(lambda: count() >= 10, timeout=60, what="steps")
    os.kill(rec.keeper_pid, signal.SIGSTOP)  # a stopped keeper: the socket fills, nothing reads
    try:
        n = count()
        wait_for(lambda: count() >= n + 300, timeout=120, what="steps while the keeper is stopped")
    finally:
        os.kill(rec.keeper_pid, signal.SIGCONT)
    trainer = status(info)["pid"]
    os.kill(rec.keeper_pid, signal.SIGKILL)  # gone mid-stream: the next send meets a closed socket
    n = count()
    wait_for(lambda: count() >= n + 50, timeout=60, what="steps after the keeper died")
    stop.touch()
    wait_for(
        lambda: steps.read_text().rstrip().endswith("done"), timeout=60, what="the trainer ends by itself"
    )
    wait_for(lambda: not Path(f"/proc/{trainer}").exists() or _state(trainer) == "Z", timeout=30, what="exit")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# --------------------------------------------------------------------------- hostile or careless peers


def _peer(info: runs.RunInfo) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(info.sock)
    return s


def _closed_by_keeper(s: socket.socket, wait: float = 10.0) -> bool:
    """Whether the keeper closed this connection (within `wait`)."""
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _closes(info: runs.RunInfo) -> list[str]:
    return [r.reason for r in _journal(info) if isinstance(r, p.ConnectionClosed)]


def test_a_lying_hello_and_a_taken_rank_are_refused(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    d = wait_for(lambda: (s := status(info)) and (s["step"] or 0) >= 3 and s, timeout=60, what="steps")
    trainer = d["pid"]
    # A Hello that names another process is refused: the kernel says who the peer is.
    liar = _peer(info)
    liar.sendall(p.frame(p.Hello(pid=trainer, rank=0)))
    assert _closed_by_keeper(liar)
    wait_for(
        lambda: any("hello claims pid" in r for r in _closes(info)), timeout=30, what="refusal journaled"
    )
    # A process of another run (this test) may not report for this one, whatever it claims.
    outsider = _peer(info)
    outsider.sendall(p.frame(p.Hello(pid=os.getpid(), rank=1)))
    assert _closed_by_keeper(outsider)
    wait_for(
        lambda: any(f"not a process of run {info.run_id}" in r for r in _closes(info)),
        timeout=30,
        what="the outsider's refusal journaled",
    )
    # An honest Hello of the run for a rank a live reporter holds is refused too, and said.
    claimant = MemberPeer(info)
    claimant.send(p.frame(p.Hello(pid=claimant.pid, rank=0)))
    assert claimant.closed_by_keeper()
    d = wait_for(
        lambda: (s := status(info)) and _finding(s, "RANK_CLAIMED") and s, timeout=30, what="RANK_CLAIMED"
    )
    f = _finding(d, "RANK_CLAIMED")
    assert (
        f is not None
        and f["evidence"]["owner_pid"] == trainer
        and f["evidence"]["claimant_pid"] == claimant.pid
    )
    assert [r["rank"] for r in d["ranks"]] == [0] and d["pid"] == trainer and d["state"] == "running"
    claimant.close()


def test_valid_frames_in_the_same_read_as_a_bad_one_still_count(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    s = MemberPeer(info)
    now = time.time()
    good = p.frame(p.Hello(pid=s.pid, rank=5)) + p.frame(p.Step(step=7, t=now, loss=1.5))
    bad = p.frame({"type": "bogus", "t": now})  # not a message of this protocol: ends the connection
    s.send(good + bad)
    assert s.closed_by_keeper()
    s.close()
    d = wait_for(
        lambda: (x := status(info)) and any(r["rank"] == 5 for r in x["ranks"]) and x,
        timeout=30,
        what="rank 5",
    )
    (rank5,) = [r for r in d["ranks"] if r["rank"] == 5]
    assert rank5["step"] == 7
    wait_for(
        lambda: any("Invalid value 'bogus'" in r for r in _closes(info)), timeout=30, what="why it closed"
    )


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def test_floods_of_connections_and_half_frames_are_bounded(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    before = _rss(keeper)
    # Slow loris: 40 connections each holding most of a 1 MiB frame (40 MiB if all were kept).
    lorises, cut_off = [], 0
    for _ in range(40):
        s = _peer(info)
        try:
            s.sendall(struct.pack(">I", 1 << 20) + b"\x00" * (900 << 10))
        except (BrokenPipeError, ConnectionResetError):
            cut_off += 1  # the keeper dropped it mid-send: over the budget already
        lorises.append(s)
    # Idle ones: more than the keeper takes at once.
    idle = [_peer(info) for _ in range(300)]
    d = status(info)  # the keeper still answers, and still watches its trainer
    assert d["keeper"] == "alive" and d["state"] == "running"
    grown = _rss(keeper) - before
    assert grown < 48 << 20, f"keeper RSS grew by {grown >> 20} MiB"
    closed = sum(_closed_by_keeper(s, wait=0.2) for s in lorises)
    assert closed >= 20 and cut_off <= closed, "the buffer budget closed too few of the half-sent frames"
    # Idle connections get a deadline for their first message; nothing is left open.
    wait_for(
        lambda: len(psutil.Process(keeper).net_connections(kind="unix")) < 20, timeout=60, what="idle closed"
    )
    # Each close is not a journal record: a few, then counts.
    reasons = _closes(info)
    assert len(reasons) <= 40, f"{len(reasons)} ConnectionClosed records for one flood"
    for s in lorises + idle:
        s.close()


def _snapshot_bytes(info: runs.RunInfo) -> int:
    """The snapshot as it travels: subscribe without live deltas and count what arrives."""
    s = _peer(info)
    s.sendall(p.frame(p.Subscribe(client="size", live=False)))
    total = 0
    while chunk := s.recv(1 << 20):
        total += len(chunk)
    s.close()
    return total


def test_a_note_flood_keeps_the_snapshot_small(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    s = MemberPeer(info)
    s.send(p.frame(p.Hello(pid=s.pid, rank=7)))
    big = "x" * (900 << 10)
    for i in range(80):
        s.send(p.frame(p.Note(kind="flood", t=time.time(), message="m", data={"blob": big, "i": i})))
    wait_for(
        lambda: sum(1 for n in snapshot(info.sock).notes if n.get("kind") == "flood") >= 80,
        timeout=60,
        what="notes",
    )
    size = _snapshot_bytes(info)
    assert size < 8 << 20, f"a snapshot of {size >> 20} MiB"
    (kept,) = {str(n["data"]) for n in snapshot(info.sock).notes if n.get("kind") == "flood"} - set() or {""}
    assert "truncated_bytes" in kept
    d = status(info)
    assert d["keeper"] == "alive"
    s.close()


# --------------------------------------------------------------------------- bad values, one line


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["launch", "--keep", "-5", "--", "sleep", "1"], "--keep"),
        (["launch", "--linger", "nan", "--", "sleep", "1"], "--linger"),
        (["launch", "--linger", "inf", "--", "sleep", "1"], "--linger"),
        (["launch", "--auto-resume", "1e9", "--", "sleep", "1"], "--auto-resume"),
        (["launch", "--disk-budget", "-3G", "--", "sleep", "1"], "--disk-budget"),
        (["launch", "--log-pattern", "(", "--", "sleep", "1"], "--log-pattern"),
        (["kill", "--grace", "nan", "--yes"], "--grace"),
        (["kill", "--grace", "inf", "--yes"], "--grace"),
        (["demo", "--steps", "0", "--no-tui"], "--steps"),
    ],
)
def test_every_numeric_option_is_finite_and_in_range(trhome: Path, argv: list[str], says: str) -> None:
    err = _one_line_error(run_cli(*argv))
    assert says in err
    assert not list((trhome / "runs").glob("*")) if (trhome / "runs").exists() else True, "a run was created"


def test_a_bad_number_in_trainroom_toml_names_the_key_and_the_file(trhome: Path, tmp_path: Path) -> None:
    (tmp_path / "trainroom.toml").write_text("[kill]\ngrace_s = inf\n")
    done = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "launch", "--", "sleep", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    err = _one_line_error(done)
    assert "kill.grace_s" in err and "trainroom.toml" in err


def test_an_action_request_with_a_bad_number_is_refused_by_the_keeper(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    c = KeeperClient(info.sock)
    for grace in (float("nan"), float("inf"), -1.0, "10"):
        r = c.confirmed("kill", {"grace_s": grace})
        assert not r.ok and "grace_s" in r.message
    # The refusals did not leave kill "already running": a real one still goes through.
    r = c.confirmed("kill", {"grace_s": 1.0})
    assert r.ok, r.message


def test_status_json_is_strict_json_with_a_nan_loss(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "nan.py"
    script.write_text(
        textwrap.dedent("""
        import time
        from trainroom.core import sdk
        rep = sdk.connect(lr=1e-3)
        for step in range(1, 1000):
            rep.step(step, loss=float("nan") if step > 3 else 2.0, grad_norm=float("inf"))
            time.sleep(0.05)
        """)
    )
    info = launch([sys.executable, str(script)], LaunchOptions(linger_s=60), cwd=str(tmp_path))
    wait_for(lambda: (status(info)["step"] or 0) > 5, timeout=60, what="steps")

    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    out = run_cli("status", info.run_id, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout, parse_constant=refuse)
    assert d["loss"] is None and d["loss_raw"] == "nan"
    assert "NONFINITE" in {f["code"] for f in d["findings"]}


def test_a_keeper_that_fails_at_start_leaves_a_failed_run_not_a_starting_one(
    trhome: Path, tmp_path: Path
) -> None:
    # The keeper refuses a root it cannot create: a file where the checkpoint root should be.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    done = run_cli("launch", "--ckpt-root", str(blocker / "ckpt"), "--", "sleep", "30")
    err = _one_line_error(done)
    assert "keeper exited at start" in err
    (run_dir,) = list((trhome / "runs").iterdir())
    d = json.loads(run_cli("status", run_dir.name, "--json").stdout)
    assert d["state"] == "failed" and "keeper exited at start" in (d["state_reason"] or "")


def test_a_busy_keeper_is_busy_not_gone(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 3, timeout=60, what="steps")
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    os.kill(keeper, signal.SIGSTOP)  # alive, but answers nobody
    try:
        out = run_cli("status", info.run_id, "--json", timeout=120)
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert d["keeper"] == "busy" and d["state"] != "unknown"
    finally:
        os.kill(keeper, signal.SIGCONT)
    assert status(info)["keeper"] == "alive"


# Imports first, as root, then the uid drops: the interpreter's own files need not be readable by
# uid 65534 (here they live under /root); what the CLI then touches is the run's.
AS_NOBODY = """
import importlib, os, pkgutil, sys
import trainroom.core
for m in pkgutil.walk_packages(trainroom.core.__path__, "trainroom.core."):
    if ".demo" not in m.name and not m.name.endswith("__main__"):
        importlib.import_module(m.name)
import trainroom.core.cli.main as cli
os.setgid(65534); os.setuid(65534)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_uid_gets_one_line_not_a_traceback(trhome: Path, tmp_path: Path) -> None:
    info = _launch_stepper(tmp_path)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    for argv in (["status"], ["kill", info.run_id, "--yes"], ["runs"]):
        done = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, *argv], capture_output=True, text=True, timeout=60
        )
        err = _one_line_error(done)
        assert "not readable" in err or "not yours" in err or "refused" in err, err
    # Open the way to the socket: then it is the keeper's own SO_PEERCRED check that refuses.
    for d in (trhome, trhome / "runs", Path(info.run_dir)):
        os.chmod(d, 0o755)
    os.chmod(info.sock, 0o777)
    done = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, "kill", info.run_id, "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "refused or dropped" in _one_line_error(done)
    assert status(info)["state"] == "running"  # and nothing happened to the run


# --------------------------------------------------------------------------- a damaged journal


def test_a_flipped_byte_in_a_crashed_keepers_journal_is_skipped_and_said(
    trhome: Path, tmp_path: Path
) -> None:
    """A keeper killed -9 (no snapshot at its exit) and then one byte of its journal flipped: the
    reader resyncs past the damage, says how much it skipped, and still reads what came after it
    (the trainer's end)."""
    info = _launch_stepper(tmp_path)
    d = wait_for(lambda: (s := status(info)) and (s["step"] or 0) >= 40 and s, timeout=60, what="steps")
    os.kill(d["pid"], signal.SIGTERM)
    wait_for(lambda: status(info)["state"] == "dead", timeout=60, what="the trainer's end")
    journal = Path(info.run_dir) / runs.JOURNAL_NAME
    wait_for(
        lambda: any(isinstance(r, p.RunStatus) and r.state == "dead" for r in _journal(info)),
        timeout=60,
        what="the end journaled",
    )
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    os.kill(keeper, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(keeper) or psutil.Process(keeper).status() == "zombie", timeout=30)
    for snap in Path(info.run_dir).glob("snapshot*"):
        snap.unlink()  # a keeper killed mid-run may have none yet: the reader replays the journal
    # One byte in the middle of a step record (or batch) between the attempt's start and its end.
    frames = [(off, end) for off, end, r in read_frames(journal) if isinstance(r, (p.Received, p.StepBatch))]
    assert len(frames) >= 3, frames
    off, end = frames[len(frames) // 2]
    middle = (off + end) // 2
    data = bytearray(journal.read_bytes())
    data[middle] ^= 0xFF
    journal.write_bytes(bytes(data))

    c = run_cli("status", info.run_id, "--json")
    assert c.returncode == 0, c.stderr
    s = json.loads(c.stdout)
    damage = s["journal_damage"]
    assert damage is not None and damage["regions"] >= 1 and damage["skipped_bytes"] > 0, damage
    assert damage["first_offset"] <= middle
    # What came after the damage is still read: the attempt's end, by SIGTERM.
    assert s["exit"]["signal_name"] == "SIGTERM" and s["state"] == "dead", s
    c = run_cli("status", info.run_id)
    assert c.returncode == 0 and "journal damaged:" in c.stdout, c.stdout + c.stderr
    assert "every record around it was kept" in c.stdout
