"""Hostile or careless input never blinds the keeper: a bad value a trainer sends costs that
value only. Every test drives a real keeper process."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p


def _launch(tmp_path: Path, body: str, **options: Any) -> runs.RunInfo:
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(body))
    options.setdefault("linger_s", 120)
    return launch([sys.executable, str(script)], LaunchOptions(**options), cwd=str(tmp_path))


def _findings(d: dict[str, Any], code: str) -> list[dict[str, Any]]:
    return [f for f in d["findings"] if f["code"] == code]


def _journal(info: runs.RunInfo) -> list[p.Record]:
    return list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


BAD_VALUES = """
    import time
    from trainroom.core import sdk
    rep = sdk.connect(lr=float("inf"), vocab_size=0, warmup_steps=2.5)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=float("nan") if step % 5 == 0 else 2.0, tokens=-1)
        time.sleep(0.05)
"""


def test_an_out_of_range_value_costs_its_field_not_the_runs_telemetry(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, BAD_VALUES)
    d = wait_for(
        lambda: (
            (s := status(info)) and (s["step"] or 0) >= 12 and len(_findings(s, "FIELD_REFUSED")) >= 4 and s
        ),
        timeout=60,
        what="steps and a FIELD_REFUSED per bad field",
    )
    assert d["instrumented"] and d["state"] == "running"
    fields = {f["evidence"]["field"]: f for f in _findings(d, "FIELD_REFUSED")}
    assert set(fields) >= {
        "hello.config.lr",
        "hello.config.vocab_size",
        "hello.config.warmup_steps",
        "step.tokens",
    }
    assert fields["hello.config.lr"]["evidence"]["value"] == "inf"
    assert "step.tokens=-1" in fields["step.tokens"]["message"]
    assert not fields["step.tokens"]["evidence"]["frame_dropped"]
    # A NaN loss is a measurement: NONFINITE, and its step is kept.
    wait_for(
        lambda: "NONFINITE" in {f["code"] for f in status(info)["findings"]}, timeout=30, what="NONFINITE"
    )
    # One connection all along: the keeper refused fields, never the trainer.
    assert not [r for r in _journal(info) if isinstance(r, p.ConnectionClosed)]
    hellos = [r for r in _journal(info) if isinstance(r, p.Received) and isinstance(r.msg, p.Hello)]
    assert len(hellos) == 1


FROZEN = """
    import time
    from trainroom.core import sdk
    rep = sdk.connect(lr=0.0, vocab_size=50257, warmup_steps=10)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        time.sleep(0.05)
"""


def test_a_requested_lr_of_zero_is_a_frozen_model_not_a_bad_value(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, FROZEN)
    d = wait_for(lambda: (s := status(info)) and (s["step"] or 0) >= 5 and s, timeout=60, what="steps")
    assert d["instrumented"] and not _findings(d, "FIELD_REFUSED")
    assert d["lr"]["requested"] == 0.0


PRINTER = """
    import sys, time
    step = 0
    while True:
        step += 1
        print(f"iter {step}: loss 2.0", flush=True)
        time.sleep(0.05)
"""


def test_a_copytruncated_trainer_log_is_followed_not_frozen(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, PRINTER)
    log = Path(info.run_dir) / runs.LOG_NAME
    wait_for(lambda: (status(info)["step"] or 0) >= 20, timeout=60, what="log steps")
    # logrotate's copytruncate: copy the file aside, cut it to nothing in place.
    (Path(info.run_dir) / "trainer.log.1").write_bytes(log.read_bytes())
    os.truncate(log, 0)
    before = status(info)["step"]
    d = wait_for(
        lambda: (s := status(info)) and (s["step"] or 0) >= before + 20 and s, timeout=60, what="steps after"
    )
    assert d["state"] == "running" and "STALLED" not in {f["code"] for f in d["findings"]}
    notes = [r for r in _journal(info) if isinstance(r, p.KeeperNote) and "truncated" in r.message]
    assert notes


BURST_THEN_CRASH = """
    import sys
    print("iter 1: loss 2.0", flush=True)
    sys.stdout.write("x" * (3 << 20) + "\\n")
    sys.stdout.write(("noise line " * 9 + "\\n") * 20000)
    sys.stdout.flush()
    raise ValueError("the real cause is here")
"""


def test_megabytes_printed_just_before_a_crash_do_not_hide_its_cause(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, BURST_THEN_CRASH, linger_s=30)
    d = wait_for(
        lambda: (s := status(info)) and s["state"] in ("dead", "exited") and s, timeout=60, what="the death"
    )
    said = " ".join(f["message"] for f in d["findings"])
    assert "the real cause is here" in said, said


HEADERLESS_CAUSE = """
    print("iter 1: loss 2.0", flush=True)
    raise SystemError("readinto") from OSError(12, "Cannot allocate memory")
"""


def test_a_cause_printed_without_a_traceback_is_still_the_cause(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, HEADERLESS_CAUSE, linger_s=30)
    d = wait_for(
        lambda: (s := status(info)) and _findings(s, "MASKED_ERROR") and s, timeout=60, what="MASKED_ERROR"
    )
    (f,) = _findings(d, "MASKED_ERROR")
    assert "hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f["message"]


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


def _subscribe(info: runs.RunInfo) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(info.sock)
    s.sendall(p.frame(p.Subscribe(client="idle watcher", live=True)))
    return s


def test_idle_subscriptions_never_lock_out_a_kill(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, STEPPER)
    wait_for(lambda: (status(info)["step"] or 0) >= 1, timeout=60, what="steps")
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    before = psutil.Process(keeper).memory_info().rss
    idle = [_subscribe(info) for _ in range(300)]  # never read: each would hold a snapshot and deltas
    # One process holds a bounded number of live subscriptions; the rest are refused and closed.
    wait_for(
        lambda: len(psutil.Process(keeper).net_connections(kind="unix")) < 40, timeout=60, what="the cap"
    )
    grown = psutil.Process(keeper).memory_info().rss - before
    assert grown < 48 << 20, f"keeper RSS grew by {grown >> 20} MiB"
    # An action from another process gets through.
    done = run_cli("kill", info.run_id, "--yes", "--grace", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: status(info)["state"] == "stopped", timeout=60, what="stopped")
    said = [r.reason for r in _journal(info) if isinstance(r, p.ConnectionClosed)]
    said += [r.message for r in _journal(info) if isinstance(r, p.KeeperNote)]
    assert any("live subscriptions already" in x or "displaced" in x for x in said), said
    for s in idle:
        s.close()


SHORT = """
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    for step in range(1, 6):
        rep.step(step, loss=2.0)
"""


def test_a_journal_that_is_a_fifo_or_a_directory_costs_that_run_only(trhome: Path, tmp_path: Path) -> None:
    infos = [_launch(tmp_path, SHORT, linger_s=0) for _ in range(3)]
    for info in infos:
        wait_for(lambda i=info: status(i)["state"] == "exited", timeout=60, what="the run's end")  # type: ignore[misc]
    good, fifo, folder = infos
    for info in (fifo, folder):
        d = Path(info.run_dir)
        for f in d.glob("*.msgpack"):
            if f.name != runs.RECORD_NAME:
                f.unlink()
    os.mkfifo(Path(fifo.run_dir) / runs.JOURNAL_NAME)
    (Path(folder.run_dir) / runs.JOURNAL_NAME).mkdir()
    listing = run_cli("runs", timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert all(i.run_id in listing.stdout for i in infos)
    assert run_cli("status", good.run_id, timeout=60).returncode == 0
    for info, kind in ((fifo, "a FIFO"), (folder, "a directory")):
        for cmd in ("status", "events", "verify"):
            done = run_cli(cmd, info.run_id, timeout=60)  # a FIFO read plainly would block here
            assert done.returncode != 0 and kind in done.stderr and "Traceback" not in done.stderr, (
                done.stderr
            )


def test_deeply_nested_toml_is_one_line_naming_the_file(trhome: Path, tmp_path: Path) -> None:
    (tmp_path / "trainroom.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    for argv in (["launch", "--", "sleep", "1"], ["doctor"]):
        done = subprocess.run(
            [sys.executable, "-m", "trainroom.cli", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        said = done.stdout + done.stderr
        assert "Traceback" not in said and "RecursionError" not in said, said
        assert "trainroom.toml" in said and "nested too deeply" in said, said
    assert done.returncode != 0


def test_the_bridge_with_garbage_on_stdin_and_its_keeper_gone_says_one_line(
    trhome: Path, tmp_path: Path
) -> None:
    info = _launch(tmp_path, SHORT, linger_s=0)
    wait_for(lambda: not runs.resolve_run(info.run_id).alive, timeout=60, what="the keeper gone")
    for garbage in (os.urandom(64), struct.pack(">I", 5) + b"hello"):
        done = subprocess.run(
            [sys.executable, "-m", "trainroom.cli", "bridge", info.run_id],
            input=garbage,
            capture_output=True,
            timeout=60,
        )
        err = done.stderr.decode()
        assert done.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "on stdin" in err


def test_a_stopped_keeper_whose_trainer_died_is_not_running(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, STEPPER)
    d = wait_for(lambda: (s := status(info)) and (s["step"] or 0) >= 3 and s, timeout=60, what="steps")
    trainer = d["pid"]
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    assert keeper is not None
    os.kill(keeper, signal.SIGSTOP)  # alive, answers nobody, reaps nobody
    try:
        os.kill(trainer, signal.SIGKILL)
        wait_for(lambda: _proc_state(trainer) in ("Z", None), timeout=30, what="the trainer's end")
        out = run_cli("status", info.run_id, "--json", timeout=120)
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        assert d["keeper"] == "busy" and d["state"] == "unknown", d
        assert f"the keeper (pid {keeper}) is stopped" in d["state_reason"]
        assert f"trainer pid {trainer} is no longer running" in d["state_reason"]
        text = run_cli("status", info.run_id, timeout=120).stdout
        assert "UNKNOWN" in text and "is stopped" in text
    finally:
        os.kill(keeper, signal.SIGCONT)
    wait_for(lambda: status(info)["state"] in ("dead", "stopped"), timeout=60, what="the keeper's verdict")


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


ESCAPES = """
    print("iter 1: loss 2.0", flush=True)
    raise ValueError("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mboom\\x1b[0m")
"""


def test_a_trainers_escape_sequences_never_reach_the_terminal(trhome: Path, tmp_path: Path) -> None:
    info = _launch(tmp_path, ESCAPES, linger_s=30)
    wait_for(
        lambda: any("boom" in f["message"] for f in status(info)["findings"]),
        timeout=60,
        what="the crash said",
    )
    for cmd in ("status", "events"):
        done = run_cli(cmd, info.run_id, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "boom" in done.stdout and "\x1b" not in done.stdout and "\x07" not in done.stdout, repr(
            done.stdout
        )


def test_a_damaged_run_record_does_not_hide_a_run_whose_journal_is_intact(
    trhome: Path, tmp_path: Path
) -> None:
    info = _launch(tmp_path, SHORT, linger_s=0)
    wait_for(lambda: status(info)["state"] == "exited", timeout=60, what="the run's end")
    (Path(info.run_dir) / runs.RECORD_NAME).write_bytes(b"\x00garbage\xff" * 8)
    assert info.run_id in [r.run_id for r in runs.list_runs()]
    d = status(info.run_id)
    assert d["state"] == "exited" and d["step"] == 5
    listing = run_cli("runs", timeout=60)
    assert listing.returncode == 0 and info.run_id in listing.stdout and "step 5" in listing.stdout, (
        listing.stdout
    )
