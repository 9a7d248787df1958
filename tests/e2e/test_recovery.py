"""Recovery end to end: a real keeper, real trainers (the CPU demo, and a torch-free
nanoGPT-like script), real signals, real locks, real files. The only stand-in is NVML, through
the fake at the pynvml boundary that the demo trainer drives (`fake_nvml`) and the test edits to
play the driver; reclaim writes into a temporary tree that mimics /sys/fs/cgroup and /proc.

Each test waits on what the keeper reports (`wait_for`, generous bounds for a loaded machine);
none asserts how fast anything happened.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from tests.support.helpers import run_cli, series_of, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.demo.launcher import demo_command, demo_dir, demo_options
from trainroom.core.demo.train import FAKE_ORPHAN_BYTES
from trainroom.core.journal import file as journal
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

START_S = 120.0  # torch's import on a loaded 2-core machine, then a few steps
GIB, MIB = 1 << 30, 1 << 20


# ------------------------------------------------------------------------------------ helpers


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _actions(info: runs.RunInfo, action: str) -> list[protocol.ActionRecord]:
    return [r for r in _journal(info) if isinstance(r, protocol.ActionRecord) and r.action == action]


def _notes(info: runs.RunInfo) -> list[str]:
    return [r.message for r in _journal(info) if isinstance(r, protocol.KeeperNote)]


def _cli_json(*args: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    out = run_cli(*args, "--json", timeout=timeout)
    assert out.stdout.strip(), f"no JSON from {args}: rc {out.returncode}, stderr {out.stderr!r}"
    return out.returncode, json.loads(out.stdout)


def _plan(info: runs.RunInfo, action: str) -> protocol.Reply:
    """The keeper's plan (or refusal) for an action, without carrying it out."""
    return KeeperClient(info.sock).call(action, confirm=False, timeout_s=120)


def _code(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _dead(info: runs.RunInfo, step: int) -> dict[str, Any]:
    return wait_for(
        lambda: (s := status(info))["state"] == "dead" and s["step"] == step and s,
        timeout=START_S,
        what=f"DEAD at step {step}",
    )


def _verified(info: runs.RunInfo, step: int) -> dict[str, Any]:
    def verified() -> dict[str, Any] | None:
        s = status(info)
        return s if any(c["state"] == "verified" and c["step"] == step for c in s["checkpoints"]) else None

    return wait_for(verified, timeout=START_S, what=f"the checkpoint of step {step} verified")


def _write_config(directory: Path, text: str) -> Path:
    path = directory / "trainroom.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _probe_cycles(info: runs.RunInfo, n: int) -> None:
    """Return once the keeper has taken `n` probe samples from now on (live deltas)."""
    c = KeeperClient(info.sock)
    try:
        c.subscribe(client="test", live=True)
        seen = 0
        for batch in c.records(timeout_s=60):
            seen += sum(isinstance(r, protocol.ProbeSample) for r in batch)
            if seen >= n:
                return
    finally:
        c.close()


# ------------------------------------------------------------------------------------ scenario 1


def test_scenario_1_silent_death_kill_resume_from_the_last_verified_step(trhome: Path) -> None:
    """Scenario 1: SIGKILL at a step with no traceback; DEAD says so at once; `kill` finds
    nothing left; `resume` continues from the last verified checkpoint with this session's LR;
    the curve carries a restart mark; steps lost = step at death - checkpoint step."""
    info = start_demo(fault="silent-death", fault_step=25, steps=40, ckpt_every=10, step_delay=0.02, lr=1e-3)
    d = _dead(info, 25)
    assert d["exit"]["signal_name"] == "SIGKILL"
    dead = _code(d, "DEAD")
    assert dead is not None and dead["severity"] == "critical" and "SIGKILL" in dead["message"]

    # Once the step-20 checkpoint has verified, DEAD counts the steps lost against it.
    def dead_against_20() -> dict[str, Any] | None:
        s = status(info)
        f = _code(s, "DEAD")
        return s if f is not None and f["evidence"].get("last_verified_step") == 20 else None

    d = wait_for(dead_against_20, timeout=START_S, what="DEAD against the verified step-20 checkpoint")
    assert _code(d, "DEAD")["evidence"]["steps_lost"] == 25 - 20

    rc, kill = _cli_json("kill", info.run_id, "--yes")
    assert rc == 0 and kill["ok"], kill
    assert "nothing left to kill" in kill["message"]
    assert kill["after"]["members"] == 0 and kill["before"]["members"] == 0

    rc, res = _cli_json("resume", info.run_id, "--yes")
    assert rc == 0 and res["ok"], res
    assert res["plan"]["step"] == 20 and res["plan"]["checkpoint"].endswith("step-000020.pt")
    assert res["before"]["died_at_step"] == 25 and res["after"]["steps_lost"] == 5
    assert res["after"]["attempt"] == 2 and res["after"]["from_step"] == 20

    d = wait_for(
        lambda: (s := status(info))["state"] == "exited" and s["attempt"] == 2 and s,
        timeout=START_S,
        what="attempt 2 runs to its end",
    )
    a1, a2 = d["attempts"]
    assert a1["last_step"] == 25 and a1["exit_signal"] == 9
    assert a2["first_step"] == 21 and a2["last_step"] == 40 and a2["exit_code"] == 0
    assert a2["resume_from"] == res["plan"]["checkpoint"]
    # This session's LR, not whatever the checkpoint's scheduler carried.
    assert d["lr"]["requested"] == pytest.approx(1e-3)
    assert d["lr"]["effective"] == [pytest.approx(1e-3)]
    assert _code(d, "LR_MISMATCH") is None and _code(d, "DEAD") is None
    marks = [m for m in series_of(info).get("marks", []) if m["kind"] == "restart"]
    assert [m["label"] for m in marks] == ["attempt 2"]
    # Both actions are in the journal, with their evidence.
    assert [r.ok for r in _actions(info, "kill")] == [True]
    (resumed,) = _actions(info, "resume")
    assert resumed.ok and resumed.after["steps_lost"] == 5


# ------------------------------------------------------------------------------------ refusals


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_resume_refuses_live_members_a_held_lock_and_unreleased_memory_each_in_turn(trhome: Path) -> None:
    """Scenario 10: the trainer died but a child kept its flock and a context kept 7 GiB. Resume
    refuses each cause by name until it is gone; kill clears the group but not the driver."""
    _write_config(
        trhome,
        """
        [kill]
        grace_s = 1.0
        vram_timeout_s = 1.0
        vram_poll_s = 0.2
    """,
    )
    info = start_demo(fault="orphan-context", fault_step=15, ckpt_every=10, step_delay=0.02)
    lock = demo_dir() / "train.lock"
    fake = Path(info.run_dir) / "fake-nvml.json"
    _dead(info, 15)
    _verified(info, 10)
    child = wait_for(lambda: _started_by(info, "time.sleep(3600)"), timeout=10, what="the orphan child")[0]

    # 1. The group still has a live member, it holds the lock, and the driver holds the memory.
    r = _plan(info, "resume")
    assert r.stage == "done" and not r.ok
    text = " | ".join(r.plan["refusals"])
    assert "still live in group" in text and str(child.pid) in text
    assert f"lock {lock} is held by pid {child.pid}" in text
    assert "the driver still holds" in text

    # 2. Kill clears the group (and with it the lock) but cannot make the driver let go.
    rc, kill = _cli_json("kill", info.run_id, "--yes")
    assert rc == 1 and not kill["ok"]
    assert kill["before"]["pids"] == [child.pid] and kill["after"]["members"] == 0
    assert "but the driver still holds" in kill["message"]
    assert kill["after"]["vram_bytes"] >= FAKE_ORPHAN_BYTES  # the orphan's dead context, at least
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE

    # 3. Memory not released: the one refusal left.
    r = _plan(info, "resume")
    assert not r.ok and len(r.plan["refusals"]) == 1
    assert re.match(
        r"the driver still holds [\d.]+ [MG]iB for the old attempt \(tolerance 512 MiB\)",
        r.plan["refusals"][0],
    )

    # 4. The driver lets go; a stranger takes the lock: that holder is named.
    write_scenario(
        fake,
        {
            "devices": [
                {
                    "name": "NVIDIA GeForce RTX 3060 (fake)",
                    "total_bytes": 12 * GIB,
                    "used_bytes": 400 * MIB,
                    "util_percent": 0,
                    "power_w": 15.0,
                }
            ],
            "processes": [],
        },
    )
    stranger = _hold_lock(lock)
    try:
        r = _plan(info, "resume")
        assert not r.ok and len(r.plan["refusals"]) == 1, r.plan
        assert r.plan["refusals"][0].startswith(f"lock {lock} is held by pid {stranger.pid} ")
    finally:
        stranger.kill()
        stranger.wait(timeout=10)

    # 5. Nothing stands in the way any more.
    r = _plan(info, "resume")
    assert r.stage == "plan" and r.plan["ok"], r.plan
    assert r.plan["step"] == 10 and r.plan["attempt"] == 2
    refused = [a for a in _actions(info, "resume") if not a.ok]
    assert len(refused) == 3  # every refusal was journaled


def _reuse_pid(pid: int, attempts: int = 50) -> subprocess.Popen[bytes] | None:
    """Start a stranger under exactly `pid` (and, being a session leader, as pgid `pid`): the
    kernel hands out ns_last_pid + 1 next. Other processes fork meanwhile, so retry."""
    knob = Path("/proc/sys/kernel/ns_last_pid")
    for _ in range(attempts):
        try:
            knob.write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "120"], start_new_session=True, stdin=subprocess.DEVNULL)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
    reason="reusing a PID on purpose needs a writable /proc/sys/kernel/ns_last_pid (root)",
)
def test_kill_refuses_a_pid_that_was_reused(trhome: Path, tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, signal, time\nprint('iter 1: loss 4.0', flush=True)\ntime.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = run_cli("launch", "--", sys.executable, str(script))
    assert out.returncode == 0, out.stderr
    info = runs.resolve_run(out.stdout.strip())
    d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=60, what="dead")
    old = d["pid"]
    # At once, well inside the second in which psutil's create times agree: the attempt's start
    # tick (recorded by the keeper) is what tells the stranger apart.
    assert runs.load_state(info.run_dir).attempt.start_ticks is not None
    stranger = _reuse_pid(old)
    if stranger is None:
        pytest.skip(f"could not get pid {old} back from the kernel in 50 tries (a busy machine)")
    try:
        rc, kill = _cli_json("kill", info.run_id, "--yes")
        assert rc == 1 and not kill["ok"]
        assert f"refusing pid {old}" in kill["message"] and "the PID was reused" in kill["message"]
        assert stranger.poll() is None  # nothing was signalled
        (rec,) = _actions(info, "kill")
        assert not rec.ok and "PID was reused" in rec.message
        # Nor does the stranger, sitting in a group of the same number, count as the old attempt's.
        r = _plan(info, "resume")
        assert not any("still live" in x for x in r.plan["refusals"]), r.plan["refusals"]
    finally:
        stranger.kill()
        stranger.wait(timeout=10)


# ------------------------------------------------------------------------------------ reclaim


def _fake_host(root: Path) -> tuple[Path, Path, Path]:
    """<root>/proc and <root>/sys/fs/cgroup as a cgroup v2 host with memory.reclaim."""
    proc, sysfs = root / "proc", root / "sys" / "fs" / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/user.slice/trainroom.scope\n")
    (proc / "meminfo").write_text(
        "MemTotal: 32768000 kB\nMemFree: 1000000 kB\nMemAvailable: 2500000 kB\n"
        "Buffers: 100000 kB\nCached: 6000000 kB\n"
    )
    (proc / "version").write_text("Linux version 6.8.0 (gcc)\n")
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    cg = sysfs / "user.slice" / "trainroom.scope"
    cg.mkdir(parents=True)
    (cg / "memory.stat").write_text("anon 1000\nfile 6000000000\n")
    reclaim = cg / "memory.reclaim"
    reclaim.write_text("")
    return proc, sysfs, reclaim


@pytest.fixture
def unwritable() -> Iterator[Any]:
    """Make a file refuse writes at the OS boundary, for root too: the immutable attribute
    (EPERM for everyone), else a read-only mode for a non-root user."""
    made: list[Path] = []

    def deny(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
            return
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip(
                "as root, a write can be denied only with the immutable attribute, and chattr +i fails here"
            )
        made.append(path)

    yield deny
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def _stub_sudo(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    bin_dir.mkdir()
    sudo = bin_dir / "sudo"
    sudo.write_text("#!/bin/sh\n" + body)
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _launch_sleeper() -> runs.RunInfo:
    return launch(["sleep", "120"], {})


@pytest.mark.parametrize("case", ["allowed", "denied-no-sudo", "denied-working-sudo"])
def test_reclaim_through_the_keeper(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unwritable: Any, case: str
) -> None:
    proc, sysfs, reclaim = _fake_host(tmp_path / "host")
    monkeypatch.setenv("TRAINROOM_SYS_ROOT", str(sysfs))
    monkeypatch.setenv("TRAINROOM_PROC_ROOT", str(proc))
    if case != "allowed":
        unwritable(reclaim)
    if case == "denied-no-sudo":
        _stub_sudo(tmp_path / "bin", monkeypatch, 'echo "sudo: a password is required" >&2\nexit 1\n')
    elif case == "denied-working-sudo":
        # A sudo with the rights the keeper lacks: for this tree, lifting the immutable bit.
        _stub_sudo(
            tmp_path / "bin",
            monkeypatch,
            f'[ "$1" = "-n" ] && shift\nchattr -i {shlex.quote(str(reclaim))} 2>/dev/null\nexec "$@"\n',
        )
    info = _launch_sleeper()  # the keeper inherits the roots and PATH from here

    plan = _plan(info, "reclaim")
    assert plan.stage == "plan" and plan.plan["method"] == "cgroup2-memory.reclaim"
    assert plan.plan["target"] == str(reclaim) and plan.plan["page_cache_bytes"] == (6000000 + 100000) * 1024

    rc, out = _cli_json("reclaim", info.run_id, "--yes")
    assert out["before"]["page_cache_bytes"] == (6000000 + 100000) * 1024
    assert out["before"]["mem_available_bytes"] == 2500000 * 1024
    (rec,) = _actions(info, "reclaim")
    assert rec.ok == out["ok"] and rec.message == out["message"]
    if case == "denied-no-sudo":
        assert rc == 1 and not out["ok"]
        assert "was denied" in out["message"] and "sudo -n: sudo: a password is required" in out["message"]
        manual = f"sudo sh -c {shlex.quote(plan.plan['script'])}"
        assert out["message"].endswith(f"run by hand: {manual}")
        assert reclaim.read_text() == ""
    else:
        assert rc == 0 and out["ok"], out
        assert ("(sudo)" if case == "denied-working-sudo" else "(direct)") in out["message"]
        assert reclaim.read_text().strip() == "6000000000 swappiness=0"  # sudo's echo adds a newline
        assert "page_cache_freed_bytes" in out["after"]


# ------------------------------------------------------------------------------------ auto-resume


def test_auto_resume_stops_on_repeat_death(trhome: Path) -> None:
    ns = argparse.Namespace(
        fault="silent-death",
        fault_step=25,
        steps=60,
        lr=None,
        step_delay=0.02,
        ckpt_every=10,
        tracer=False,
        ranks=None,
        auto_resume=3,
        linger_s=None,
    )
    opts = msgspec.structs.replace(demo_options(ns), auto_resume_delay_s=0.5)
    info = launch([*demo_command(ns), "--fault-every-attempt"], opts, cwd=str(demo_dir()))
    note = wait_for(
        lambda: next((n for n in _notes(info) if n.startswith("auto-resume stopped")), None),
        timeout=2 * START_S,
        what="auto-resume to stop",
    )
    assert "REPEAT_DEATH" in note
    d = status(info)
    assert [a["last_step"] for a in d["attempts"]] == [25, 25]
    assert all(a["exit_signal"] == 9 for a in d["attempts"])
    rd = _code(d, "REPEAT_DEATH")
    assert rd is not None and rd["evidence"]["attempts"] == [1, 2]
    assert any(n.startswith("auto-resume 1/3: attempt 2 started") for n in _notes(info))
    assert d["state"] == "dead" and d["attempt"] == 2  # it stopped: never a third attempt into the same death


# ------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "toml, key, expected",
    [
        ('[thresholds]\nstall_floor_s = "ten"\n', "thresholds.stall_floor_s", "expected float, got str"),
        ("[kill]\ngrace = 5\n", "kill.grace", "unknown key"),
    ],
)
def test_a_bad_config_file_stops_launch_with_exit_2(
    trhome: Path, tmp_path: Path, toml: str, key: str, expected: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    path = _write_config(project, toml)
    out = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "launch", "--", "sleep", "30"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, out
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{path}: {key}: {expected}" in err
    assert not runs.list_runs()  # no keeper was started


# ------------------------------------------------------------------------------------ uninstrumented


NANOGPT_LIKE = '''
"""A torch-free trainer in nanoGPT's shape: prints `iter N: loss L, ...`, overwrites out/ckpt.pt
(a plain pickle of its state), and resumes from `--resume PATH`."""
import argparse, os, pickle, signal, time

ap = argparse.ArgumentParser()
ap.add_argument("--resume")
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--die-at", type=int, default=25)
ap.add_argument("--learning_rate", type=float, default=6e-4)
args = ap.parse_args()
os.makedirs("out", exist_ok=True)
it = 0
if args.resume:
    with open(args.resume, "rb") as f:
        state = pickle.load(f)
    it = state["iter_num"]
    print(f"resuming from {args.resume} at iter {it}", flush=True)
while it < args.steps:
    it += 1
    print(f"iter {it}: loss {4.0 - it / 100:.4f}, time 10.00ms, mfu 1.00%", flush=True)
    if it % 10 == 0:
        state = {"model": {"wte": [0.1] * 8}, "optimizer": {}, "iter_num": it, "best_val_loss": 4.0,
                 "config": {"learning_rate": args.learning_rate}}
        with open("out/ckpt.pt", "wb") as f:
            pickle.dump(state, f)
    if it == args.die_at and not args.resume:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
'''


def test_uninstrumented_trainer_kill_and_resume_through_a_template(trhome: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(NANOGPT_LIKE)
    template = f"{shlex.quote(sys.executable)} train.py --resume {{ckpt}}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainroom.cli",
            "launch",
            "--resume-template",
            template,
            "--watch-ckpt",
            "out/ckpt.pt",
            "--",
            sys.executable,
            "train.py",
            "--learning_rate=6e-4",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    info = runs.resolve_run(out.stdout.strip())
    d = _dead(info, 25)
    assert d["instrumented"] is False and d["exit"]["signal_name"] == "SIGKILL"
    ckpt = str(project / "out" / "ckpt.pt")
    # The watched file settles, verifies (a plain pickle reads as nanoGPT-like state at iter 20).
    _verified(info, 20)

    rc, kill = _cli_json("kill", info.run_id, "--yes")
    assert rc == 0 and kill["ok"] and "nothing left to kill" in kill["message"], kill

    rc, res = _cli_json("resume", info.run_id, "--yes")
    assert rc == 0 and res["ok"], res
    assert res["plan"]["checkpoint"] == ckpt and res["plan"]["step"] == 20
    assert res["plan"]["argv"] == [sys.executable, "train.py", "--resume", ckpt]
    assert res["after"]["steps_lost"] == 5

    d = wait_for(
        lambda: (s := status(info))["state"] == "exited" and s["attempt"] == 2 and s,
        timeout=60,
        what="attempt 2 runs to its end",
    )
    a1, a2 = d["attempts"]
    assert a1["last_step"] == 25 and a2["first_step"] == 21 and a2["last_step"] == 40
    assert a2["resume_from"] == ckpt and a2["exit_code"] == 0
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert f"resuming from {ckpt} at iter 20" in log


# ------------------------------------------------------------------------------------ dump, bench


def test_dump_stacks_of_a_hung_demo_shows_the_main_thread(trhome: Path) -> None:
    info = start_demo(fault="hang-lock", fault_step=5, step_delay=0.02, ckpt_every=0)
    wait_for(lambda: status(info)["state"] == "hung", timeout=START_S, what="HUNG")
    rc, out = _cli_json("dump", info.run_id)  # no confirmation: a dump changes nothing
    assert rc == 0 and out["ok"], out
    assert out["after"]["method"] == "faulthandler"
    stacks = out["after"]["stacks"]
    # The main thread, parked in the second acquire of its own lock inside the training loop.
    main = re.search(
        r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\n((?:  .*\n?)+)", stacks
    )
    assert main is not None, stacks
    blocks = re.findall(
        r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\n((?:  .*\n?)+)", stacks
    )
    assert any(re.search(r'File ".*demo/train\.py", line \d+ in main', b) for b in blocks), stacks
    assert len(blocks) >= 2  # the reporter's heartbeat thread goes on beside it
    # The dump neither killed the trainer nor woke its parked main thread (SIGUSR1 went to the
    # heartbeat thread), so the verdict stays HUNG once the next probe has looked again.
    _probe_cycles(info, 2)  # the activity view read again after the dump
    d = status(info)
    assert d["state"] == "hung" and d["attempt"] == 1, (d["state"], d["state_reason"])

    # What HUNG offers next: kill the group, for real, and see it die.
    rc, kill = _cli_json("kill", info.run_id, "--yes", "--grace", "2")
    assert rc == 0 and kill["ok"], kill
    assert kill["before"]["pids"] == [d["pid"]] and kill["after"]["members"] == 0
    # The user's own kill: a stop, said as such (no DEAD finding), not a death.
    d = wait_for(
        lambda: (s := status(info))["state"] == "stopped" and s, timeout=30, what="stopped by the kill"
    )
    assert d["exit"]["signal_name"] in ("SIGTERM", "SIGKILL") and "stopped by" in d["state_reason"]
    assert not [f for f in d["findings"] if f["code"] == "DEAD"]


def test_bench_without_a_keeper_runs_here(trhome: Path) -> None:
    rc, out = _cli_json("bench", "--device", "cpu", "--seconds", "0.3")
    assert out["ok"] and out["device"] == "cpu" and out["dtype"] == "float32"
    assert out["tflops"] > 0 and out["verdict"] in ("ok", "slow")
    assert rc == (0 if out["verdict"] == "ok" else 1)


def test_bench_through_a_live_keeper(trhome: Path) -> None:
    info = _launch_sleeper()
    rc, out = _cli_json("bench", "--device", "cpu", "--seconds", "0.3")
    assert rc == 0 and out["ok"], out
    assert out["after"]["device"] == "cpu" and out["after"]["tflops"] > 0
    assert "TFLOPS" in out["message"]
    (rec,) = _actions(info, "bench")
    assert rec.ok and rec.after["tflops"] == out["after"]["tflops"]


def _started_by(info: runs.RunInfo, marker: str) -> list[psutil.Process]:
    """Processes this run started (its id in their environment) whose command line has `marker`:
    never a process of another test or of the machine."""
    out = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.info["environ"] or {}
        except psutil.Error:
            continue
        if env.get("TRAINROOM_RUN") == info.run_id and marker in " ".join(proc.info["cmdline"] or []):
            out.append(proc)
    return out


def test_configured_host_processes_reach_the_probe_sweep(trhome: Path, tmp_path: Path) -> None:
    """`host_processes` in trainroom.toml: two instances of the VM's host process (here a copy
    of sleep under a name of its own) are DUPLICATE_TRAINER with both pids."""
    name = f"trvm{secrets.token_hex(3)}"  # this test's own: never another test's process
    exe = tmp_path / name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", exe)
    _write_config(trhome, f'host_processes = ["{name}"]\n')
    twins = [subprocess.Popen([str(exe), "120"], stdin=subprocess.DEVNULL) for _ in range(2)]
    try:
        info = _launch_sleeper()

        def host_duplicate() -> dict[str, Any] | None:
            f = _code(status(info), "DUPLICATE_TRAINER")
            return f if f is not None and f["evidence"].get("kind") == "host" else None

        f = wait_for(host_duplicate, timeout=60, what="DUPLICATE_TRAINER (host)")
        assert f["evidence"]["name"] == name and f["evidence"]["pids"] == sorted(t.pid for t in twins)
    finally:
        for t in twins:
            t.kill()
            t.wait(timeout=10)


def test_a_users_kill_is_not_counted_as_a_repeat_death(trhome: Path) -> None:
    """Attempt 1 dies at step 25, auto-resume starts attempt 2 from step 20; the user stops it with
    `trainroom kill` near step 25: a stop, not a second death in the same place."""
    ns = argparse.Namespace(
        fault="silent-death",
        fault_step=25,
        steps=400,
        lr=None,
        step_delay=0.05,
        ckpt_every=10,
        tracer=False,
        ranks=None,
        auto_resume=1,
        linger_s=None,
    )
    opts = msgspec.structs.replace(demo_options(ns), auto_resume_delay_s=0.5)
    info = launch(demo_command(ns), opts, cwd=str(demo_dir()))
    wait_for(
        lambda: (s := status(info))["attempt"] == 2 and (s["step"] or 0) >= 26 and s,
        timeout=2 * START_S,
        what="attempt 2 past step 25",
    )
    out = run_cli("kill", info.run_id, "--grace", "2", "--yes")
    assert out.returncode == 0, out.stderr
    d = wait_for(lambda: (s := status(info))["state"] != "running" and s, timeout=START_S, what="stopped")
    assert [a["last_step"] is not None for a in d["attempts"]] == [True, True]
    assert abs(d["attempts"][1]["last_step"] - 25) <= 50  # within REPEAT_DEATH's window of attempt 1's
    assert _code(d, "REPEAT_DEATH") is None, d["findings"]
