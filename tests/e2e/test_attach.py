"""`trainroom attach`: a real trainer started without trainroom (`setsid python train.py >log 2>&1 &`
from a shell that exits at once), adopted by a real keeper that is not its parent.

Each trainer carries a per-test marker in its environment; the teardown ends only processes that
carry it (and that this test started), never anything found by name.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, status_json
from tests.support.waiting import wait_for
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "nanogpt_like.py"
DDP = Path(__file__).resolve().parents[1] / "support" / "trainers_ddp" / "train_ddp.py"
START_S = 120  # torch imported by the trainer (and the keeper's verifier) on a loaded machine
MARK = "TRAINROOM_TEST_ATTACH"


class Outside:
    """Trainers started the way a user starts them, without trainroom."""

    def __init__(self, tmp_path: Path) -> None:
        self.cwd = tmp_path
        self.marker = f"attach-{uuid.uuid4().hex[:12]}"
        self.pids: list[int] = []

    def env(self) -> dict[str, str]:
        return os.environ | {MARK: self.marker}

    def start(self, *args: str, stdout: int | None = None, argv: list[str] | None = None) -> tuple[int, Path]:
        """`setsid python nanogpt_like.py ARGS >log 2>&1 &` from a shell that exits at once (the
        trainer's parent is then init), or with its stdout on `stdout` (a terminal)."""
        log = self.cwd / f"train-{len(self.pids)}.log"
        words = " ".join(shlex.quote(a) for a in (argv or [sys.executable, str(SCRIPT), *args]))
        if stdout is None:
            cmd = f"setsid {words} > {shlex.quote(str(log))} 2>&1 & echo $!"
            out = subprocess.run(
                ["bash", "-c", cmd], cwd=self.cwd, env=self.env(), capture_output=True, text=True, check=True
            )
        else:
            # Its stdout and stderr a terminal, as in a tmux pane.
            r, w = os.pipe()
            proc = subprocess.Popen(
                ["bash", "-c", f"setsid {words} </dev/null {w}>&- & echo $! >&{w}"],
                cwd=self.cwd,
                env=self.env(),
                stdout=stdout,
                stderr=stdout,
                pass_fds=(w,),
            )
            os.close(w)
            proc.wait(timeout=30)
            with os.fdopen(r) as f:
                out = subprocess.CompletedProcess([], 0, f.readline(), "")
        pid = int(out.stdout.strip())
        self.pids.append(pid)
        return pid, log

    def ours(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).environ().get(MARK) == self.marker
        except psutil.Error:
            return False

    def end(self) -> None:
        for pid in self.pids:
            if self.ours(pid):
                with_children = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
                for p in with_children:
                    if p.environ().get(MARK) == self.marker:
                        p.kill()


@pytest.fixture
def outside(trhome: Path, tmp_path: Path) -> Iterator[Outside]:
    o = Outside(tmp_path)
    try:
        yield o
    finally:
        o.end()


def stepping(log: Path, n: int = 3) -> Callable[[], bool]:
    """The trainer has printed iteration n (torch is imported by then)."""
    return lambda: log.exists() and f"iter {n}:" in log.read_text(errors="replace")


def attach(pid: int, *args: str) -> str:
    out = run_cli("attach", str(pid), *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def state_is(run: str, *states: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        d = status_json(run)
        return d if d["state"] in states else None

    return check


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def test_attached_trainer_is_watched_hung_killed_alone_and_taken_over(outside: Outside) -> None:
    pid, log = outside.start("--iters", "100000", "--save-every", "25", "--delay", "0.2", "--out_dir", "out")
    wait_for(stepping(log), timeout=START_S, what="the trainer stepping")
    template = (
        f"{sys.executable} {SCRIPT} --iters 100000 --delay 0.2 --init_from resume --out_dir {{ckpt_dir}}"
    )
    run = attach(pid, "--resume-template", template)
    d = status_json(run)
    assert d["attached"] is True and d["pid"] == pid and d["attempt"] == 1
    rec = runs.read_record(Path(runs.resolve_run(run).run_dir))
    assert rec.attached is not None and rec.attached.log == str(log)
    assert rec.attached.ckpt_dir == str(outside.cwd / "out") and rec.attached.env[MARK] == outside.marker
    text = run_cli("status", run).stdout
    assert f"pid {pid}  attached" in text, text
    assert "attached" in run_cli("runs").stdout

    # Steps come from its log; SIGSTOP is HUNG, SIGCONT clears it.
    wait_for(lambda: status_json(run)["step"] is not None, timeout=60, what="a step read from its log")
    os.kill(pid, signal.SIGSTOP)
    hung = wait_for(state_is(run, "hung"), timeout=60, what="HUNG after SIGSTOP")
    assert "stopped" in (_finding(hung, "HUNG") or {}).get("message", "")
    out = run_cli("continue", run, "--yes")  # SIGCONT through the keeper, the same proofs as a kill
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(state_is(run, "running"), timeout=60, what="running again after continue")
    out = run_cli("dump", run, timeout=120)  # py-spy, on a process the keeper did not start
    assert out.returncode == 0 and "nanogpt_like.py" in out.stdout, out.stdout + out.stderr

    # nanoGPT's ckpt.pt, watched in the directory its --out_dir names, is verified.
    ckpt = str(outside.cwd / "out" / "ckpt.pt")
    wait_for(
        lambda: any(c["path"] == ckpt and c["state"] == "verified" for c in status_json(run)["checkpoints"]),
        timeout=START_S,
        what="ckpt.pt verified",
    )

    # A takeover while it lives is refused with the reason.
    out = run_cli("resume", run, "--yes")
    assert out.returncode != 0 and "still running" in (out.stdout + out.stderr), out

    # The kill's plan promises a wait for GPU memory only where the driver is seen (else says why).
    c = KeeperClient(runs.resolve_run(run).sock)
    try:
        planned = c.call("kill", {}, confirm=False).plan or {}
    finally:
        c.close()
    print(f"kill plan: GPU wait {planned.get('vram_timeout_s')}, unseen: {planned.get('vram_unseen')}")
    if planned.get("vram_unseen"):  # no GPU here: its reason, and no wait
        assert (
            planned["vram_unseen"].startswith("driver view unavailable")
            and planned.get("vram_timeout_s") is None
        )
    else:
        assert planned.get("vram_timeout_s") is not None, planned

    # kill: the run's group, nothing else (a sibling of the test survives).
    sibling = subprocess.Popen(["sleep", "600"], env=outside.env())
    try:
        out = run_cli("kill", run, "--yes")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"pgid {pid}" in out.stdout
        wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", timeout=30)
        assert sibling.poll() is None
    finally:
        sibling.kill()
        sibling.wait()
    stopped = wait_for(state_is(run, "stopped"), timeout=30, what="stopped by the kill")
    assert stopped["attempt"] == 1

    # Takeover: its own command, cwd and environment under the keeper, from the verified ckpt.pt.
    out = run_cli("resume", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    d = wait_for(
        lambda: (s := status_json(run))["attempt"] == 2 and s["state"] == "running" and s["step"] and s,
        timeout=START_S,
        what="attempt 2 stepping under the keeper",
    )
    assert d["attached"] is False and d["run"] == run and d["pid"] != pid
    p2 = psutil.Process(d["pid"])
    assert p2.environ().get(MARK) == outside.marker and p2.cwd() == str(outside.cwd)
    assert (
        "--init_from" in p2.cmdline()
        and p2.ppid() == runs.read_record(Path(runs.resolve_run(run).run_dir)).keeper_pid
    )
    assert "resuming from" in log.read_text(errors="replace")  # attempt 2 writes to the same log
    run_cli("kill", run, "--yes")


def test_sigkill_is_dead_with_exit_status_unknown_and_a_nan_is_nonfinite(outside: Outside) -> None:
    pid, log = outside.start(
        "--iters", "100000", "--delay", "0.05", "--nan-from", "40", "--save-every", "100000"
    )
    wait_for(stepping(log), timeout=START_S, what="the trainer stepping")
    run = attach(pid)
    d = wait_for(
        lambda: (s := status_json(run)) and _finding(s, "NONFINITE") and s, timeout=60, what="NONFINITE"
    )
    assert "nan" in (_finding(d, "NONFINITE") or {})["message"].lower()
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    dead = wait_for(state_is(run, "dead"), timeout=30, what="DEAD after SIGKILL")
    took = time.monotonic() - t0
    f = _finding(dead, "DEAD")
    assert f is not None, dead
    assert "exit status unknown (attached, not its parent)" in f["message"]
    assert f["evidence"]["last_step"] is not None and f["evidence"]["last_step"] >= 40
    # no checkpoint: what it trained before the attach is lost too, and said so
    assert "steps lost since trainroom attached (step " in f["message"], f["message"]
    # and a takeover, refused, says how the run starts again
    out = run_cli("resume", run, "--yes")
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "no verified checkpoint" in said, said
    assert "`trainroom launch -- " in said and "starts it again from scratch" in said, said
    assert "kernel log" in f["message"]  # an OOM kill named, or none, or why it could not be read
    print(f"DEAD {took:.2f} s after SIGKILL")


def test_an_attached_block_buffered_nanogpt_shows_its_pace(outside: Outside) -> None:
    """nanoGPT prints without flushing: to a file, its lines come 8 KiB (some 150 iterations) at a
    time, all read at one moment. steps/s is its iteration times' (within 25 % of its own record),
    said to be, where it was "?" (the records' read times gave no pace)."""
    rec = outside.cwd / "iters.jsonl"
    pid, log = outside.start(
        "--iters", "100000", "--delay", "0.03", "--save-every", "100000", "--no-flush", "--record", str(rec)
    )
    wait_for(stepping(log), timeout=START_S, what="the trainer's first 8 KiB of lines")
    run = attach(pid)

    def paced() -> dict[str, Any] | None:
        d = status_json(run)
        return d if d["steps_per_s"] is not None and (d["step"] or 0) > 64 else None

    d = wait_for(paced, timeout=START_S, what="a pace for the attached run")
    assert d["steps_per_s_from"] == "iteration times", d
    step = d["step"]
    rows = [r for r in map(json.loads, rec.read_text().splitlines()) if step - 32 <= r["iter"] <= step]
    true = (rows[-1]["iter"] - rows[0]["iter"]) / (rows[-1]["t"] - rows[0]["t"])
    assert d["steps_per_s"] == pytest.approx(true, rel=0.25), (d["steps_per_s"], true)
    assert "steps/s (from the log: the trainer's iteration times)" in run_cli("status", run).stdout


def test_attach_refuses_what_is_not_a_trainer_in_one_line(outside: Outside) -> None:
    sleeper = subprocess.Popen(["sleep", "600"], env=outside.env())
    try:
        out = run_cli("attach", str(sleeper.pid))
        assert out.returncode == 2 and "is not a trainer" in out.stderr, out
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    out = run_cli("attach", str(sleeper.pid))
    assert (
        out.returncode == 2 and "no such process" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    )
    out = run_cli("attach", "1")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_a_trainer_writing_to_a_terminal_is_listed_asked_for_its_log_and_detached(outside: Outside) -> None:
    master, slave = pty.openpty()
    try:
        pid, _ = outside.start("--iters", "100000", "--delay", "0.1", stdout=slave)
        wait_for(lambda: has_torch(pid), timeout=START_S, what="torch loaded in the trainer")
        # No PID and no terminal to ask on: the candidates, exit 2.
        out = run_cli("attach")
        assert out.returncode == 2 and f"pid {pid}" in out.stderr, out.stderr
        # Asked for its log on a terminal: the answer is the run's log.
        side = outside.cwd / "side.log"
        side.write_text("")
        run = _attach_on_a_terminal(pid, str(side))
        info = runs.resolve_run(run)
        assert os.readlink(Path(info.run_dir) / runs.LOG_NAME) == str(side)
        # stop-keeper detaches: the trainer runs on.
        out = run_cli("stop-keeper", run)
        assert out.returncode == 0 and "detached" in out.stdout, out.stdout + out.stderr
        assert psutil.Process(pid).status() != "zombie"
        d = status_json(run)
        assert d["state"] == "orphaned" and "detached" in d["state_reason"]
    finally:
        os.close(master)
        os.close(slave)


def has_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _attach_on_a_terminal(pid: int, answer: str) -> str:
    """`trainroom attach PID` on a terminal: answer its question about the log; the run id."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainroom.cli", "attach", str(pid)],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    while b"log file" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            seen += os.read(master, 4096)
    assert b"log file" in seen, seen
    os.write(master, answer.encode() + b"\n")
    out, _ = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 0, seen
    return out.strip()


def test_attaching_to_a_torchrun_worker_adopts_the_agent_and_names_both_ranks(outside: Outside) -> None:
    agent, _log = outside.start(
        argv=[
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(DDP),
            "--step-delay",
            "0.1",
        ]
    )

    def workers() -> dict[int, int] | None:
        found = {}
        for child in psutil.Process(agent).children():
            rank = child.environ().get("RANK")
            if rank is not None and has_torch(child.pid):
                found[int(rank)] = child.pid
        return found if sorted(found) == [0, 1] else None

    ranks = wait_for(workers, timeout=START_S, what="torchrun's two workers with torch loaded")
    out = run_cli("attach", str(ranks[1]))
    assert out.returncode == 0, out.stderr
    run = out.stdout.strip()
    assert f"torchrun agent of worker {ranks[1]}" in out.stderr
    d = wait_for(
        lambda: (
            (s := status_json(run))["pid"] == agent
            and [(r["rank"], r["pid"]) for r in s["ranks"]] == sorted(ranks.items())
            and s
        ),
        timeout=START_S,
        what="both ranks named with their pids",
    )
    assert d["attached"] is True
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    for pid in (agent, *ranks.values()):
        wait_for(
            lambda pid=pid: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", timeout=30
        )


def test_an_hf_trainer_s_checkpoint_dirs_are_found_from_its_output_dir_and_verified(outside: Outside) -> None:
    hf = Path(__file__).resolve().parents[1] / "support" / "trainers" / "hf_train.py"
    argv = [sys.executable, str(hf), "--output_dir", "out", "--use_cpu", "--per_device_train_batch_size", "4"]
    argv += ["--logging_steps", "5", "--save_steps", "20", "--max_steps", "100000", "--step_delay", "0.1"]
    pid, log = outside.start(argv=argv)
    wait_for(
        lambda: has_torch(pid) and log.exists() and "loss" in log.read_text(errors="replace"), timeout=START_S
    )
    out = run_cli("attach", str(pid))
    assert out.returncode == 0, out.stderr
    run = out.stdout.strip()
    assert f"checkpoints: {outside.cwd / 'out'} (--output_dir)" in out.stderr, out.stderr
    d = wait_for(
        lambda: (
            (s := status_json(run))
            and any(c["state"] == "verified" and "checkpoint-" in c["path"] for c in s["checkpoints"])
            and s
        ),
        timeout=START_S,
        what="an HF checkpoint-N/ verified",
    )
    assert d["attached"] is True and d["step"] is not None
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr


def test_kill_of_a_trainer_that_does_not_lead_its_group_spares_the_script_that_started_it(
    outside: Outside,
) -> None:
    """`setsid bash -c 'python train.py; …'`: the script leads the group, the trainer is its child.
    A kill of the attached trainer ends it (and what it started), never the script."""
    words = " ".join(
        shlex.quote(a) for a in (sys.executable, str(SCRIPT), "--iters", "100000", "--delay", "0.05")
    )
    script, log = outside.start(argv=["bash", "-c", f"{words}; sleep 600"])

    def trainer() -> int | None:
        kids = [c for c in psutil.Process(script).children() if c.name().startswith("python")]
        return kids[0].pid if kids and has_torch(kids[0].pid) else None

    pid = wait_for(trainer, timeout=START_S, what="the script's trainer with torch loaded")
    assert os.getpgid(pid) == script != pid
    run = attach(pid)
    out = run_cli("kill", run, "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", timeout=30)
    assert psutil.Process(script).status() != "zombie"  # the script lives on
    assert log.exists()
