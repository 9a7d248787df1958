"""A finding's key acts on what the finding names, and a user's kill is a stop, not a crash. Real
keepers, real trainers, real intruders and stragglers (the driver's process list from the fake
NVML, the one stand-in on a machine without a GPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"
GIB = 1 << 30
START_S = 120.0  # torch import on a loaded 2-core machine, with margin


def _journal(info: runs.RunInfo) -> list[p.Record]:
    return list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_finding(info: runs.RunInfo, ident: str) -> dict[str, Any]:
    done = run_cli("kill", info.run_id, "--finding", ident, "--grace", "2", "--yes", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_the_duplicates_key_kills_the_other_trainer_and_ours_runs_on(trhome: Path) -> None:
    info = start_demo(fault="duplicate", step_delay=0.05)
    d = wait_for(
        lambda: (f := _finding(status(info), "DUPLICATE_TRAINER")) and f["target"] and f,
        timeout=START_S,
        what="DUPLICATE_TRAINER with a target",
    )
    (intruder,) = d["target"]["pids"]
    ours = status(info)["attempts"][-1]["pid"]
    assert intruder != ours and d["action"] == "kill"
    assert d["target"]["label"] == f"pid {intruder}, the other trainer"
    out = _kill_finding(info, d["ident"])
    assert out["ok"], out
    assert [m["pid"] for m in out["plan"]["members"]] == [intruder]
    assert out["plan"]["finding"] == d["ident"]
    assert _gone(intruder) and not _gone(ours)
    step = status(info)["step"]
    wait_for(lambda: status(info)["step"] > step + 5, timeout=60, what="our trainer steps on")
    assert status(info)["state"] == "running"
    wait_for(lambda: _finding(status(info), "DUPLICATE_TRAINER") is None, timeout=60, what="cleared")
    (rec,) = [r for r in _journal(info) if isinstance(r, p.ActionRecord) and r.action == "kill"]
    assert rec.ok and rec.target["finding"] == d["ident"]


def test_a_users_kill_is_stopped_and_never_auto_resumed(trhome: Path) -> None:
    info = start_demo(step_delay=0.05, auto_resume=3, linger_s=120)
    wait_for(lambda: (status(info)["step"] or 0) >= 10, timeout=START_S, what="ten steps")
    done = run_cli("kill", info.run_id, "--grace", "5", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    note = wait_for(
        lambda: next(
            (r.message for r in _journal(info) if isinstance(r, p.KeeperNote) and r.kind == "auto-resume"),
            None,
        ),
        timeout=60,
        what="the auto-resume's word on the stop",
    )
    assert note.startswith("auto-resume: attempt 1 was stopped by") and note.endswith("not resumed")
    d = status(info)
    assert d["state"] == "stopped" and "stopped by" in d["state_reason"]
    assert _finding(d, "DEAD") is None and len(d["attempts"]) == 1
    (stopping,) = [r for r in _journal(info) if isinstance(r, p.AttemptStopping)]
    assert stopping.n == 1 and stopping.by


# A trainer whose data-loader-like child leaves its session (setsid) and so survives the
# trainer's SIGKILL: it carries the run's id and attempt in its environment.
LEAVES_A_STRAGGLER = """
    import subprocess, sys, time
    from trainroom.core import sdk
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open(sys.argv[1], "w") as f:
        f.write(str(child.pid))
    rep = sdk.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, alloc=(1 << 30, 1 << 30, 1 << 30))
        time.sleep(0.05)
"""


def test_a_straggler_holding_a_context_is_killed_by_its_findings_key(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = tmp_path / "gpu.json"
    write_scenario(gpu, {"devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 0}]})
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    script, pid_file = tmp_path / "t.py", tmp_path / "child"
    script.write_text(textwrap.dedent(LEAVES_A_STRAGGLER))
    info = launch(
        [sys.executable, str(script), str(pid_file)], LaunchOptions(linger_s=120), cwd=str(tmp_path)
    )
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, what="the child"))
    try:
        d = wait_for(lambda: (s := status(info))["step"] and s, timeout=60, what="steps")
        os.kill(d["attempts"][-1]["pid"], signal.SIGKILL)
        wait_for(lambda: status(info)["state"] == "dead", timeout=60, what="dead")
        # The driver still lists the straggler's context.
        write_scenario(
            gpu,
            {
                "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": GIB}],
                "processes": [{"pid": child, "used_bytes": GIB}],
            },
        )
        f = wait_for(lambda: _finding(status(info), "ORPHAN_CONTEXT"), timeout=60, what="ORPHAN_CONTEXT")
        assert f["ident"] == f"ORPHAN_CONTEXT:pid-{child}" and f["action"] == "kill"
        assert f["target"]["pids"] == [child] and "left from attempt 1" in f["target"]["label"]
        argv = ["kill", info.run_id, "--finding", f["ident"], "--grace", "2", "--yes", "--json"]
        kill = subprocess.Popen(
            [sys.executable, "-m", "trainroom.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: _gone(child), timeout=60, what="the straggler gone")
        # The driver lets the context go once its process is gone.
        write_scenario(gpu, {"devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 0}]})
        stdout, stderr = kill.communicate(timeout=120)
        assert kill.returncode == 0, stdout + stderr
        out = json.loads(stdout)
        assert [m["pid"] for m in out["plan"]["members"]] == [child]
        assert out["before"]["vram_bytes"] == GIB and out["after"]["vram_bytes"] == 0
        assert "VRAM 1.0 GiB -> 0" in out["message"] or "VRAM 1.0 GiB -> 0 B" in out["message"], out[
            "message"
        ]
        assert status(info)["state"] == "dead"  # killing a leftover is no stop of the dead attempt
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_resume_that_starts_over_is_resume_from_scratch(trhome: Path, tmp_path: Path) -> None:
    work = tmp_path / "nanogpt"
    work.mkdir()
    info = launch(
        [sys.executable, str(NANOGPT_LIKE), "--iters", "100000", "--save-every", "10", "--wait-copies"],
        LaunchOptions(watch_ckpt=["out/*.pt"], keep_verified_copies=True, linger_s=120),
        cwd=str(work),
    )

    def verified(d: dict[str, Any]) -> int:
        return max((c["step"] or 0 for c in d["checkpoints"] if c["state"] == "verified"), default=0)

    d = wait_for(
        lambda: verified(s := status(info)) >= 30 and s, timeout=START_S + 120, what="step 30 verified"
    )
    os.kill(d["attempts"][-1]["pid"], signal.SIGKILL)
    wait_for(lambda: status(info)["state"] == "dead", timeout=60, what="dead")
    # No template: the plan says the command is unchanged and the trainer decides where it starts.
    done = run_cli("resume", info.run_id, "--yes", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no resume template" in done.stdout
    f = wait_for(
        lambda: _finding(status(info), "RESUME_FROM_SCRATCH"), timeout=START_S, what="RESUME_FROM_SCRATCH"
    )
    assert f["severity"] == "critical" and f["action"] == "kill"
    ev = f["evidence"]
    assert ev["resume_step"] >= 30 and ev["first_step"] < 10
    run_cli("kill", info.run_id, "--grace", "2", "--yes")


def test_a_kill_waiting_for_vram_counts_down_and_a_cancel_ends_the_wait(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = tmp_path / "gpu.json"
    write_scenario(gpu, {"devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 0}]})
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    script, pid_file = tmp_path / "t.py", tmp_path / "child"
    script.write_text(textwrap.dedent(LEAVES_A_STRAGGLER))
    info = launch(
        [sys.executable, str(script), str(pid_file)], LaunchOptions(linger_s=120), cwd=str(tmp_path)
    )
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, what="the child"))
    try:
        d = wait_for(lambda: (s := status(info))["step"] and s, timeout=60, what="steps")
        os.kill(d["attempts"][-1]["pid"], signal.SIGKILL)
        wait_for(lambda: status(info)["state"] == "dead", timeout=60, what="dead")
        # The driver lists the straggler's context, and goes on listing it after its process ends.
        write_scenario(
            gpu,
            {
                "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": GIB}],
                "processes": [{"pid": child, "used_bytes": GIB}],
            },
        )
        f = wait_for(lambda: _finding(status(info), "ORPHAN_CONTEXT"), timeout=60, what="ORPHAN_CONTEXT")
        kill = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainroom.cli",
                "kill",
                info.run_id,
                "--finding",
                f["ident"],
                "--grace",
                "2",
                "--yes",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        assert kill.stdout is not None
        lines: list[str] = []
        for line in kill.stdout:
            lines.append(line.rstrip("\n"))
            if line.rstrip().endswith("s left"):
                break
        # The plan in words: the signals and the grace, then a countdown while the driver holds on.
        assert any("SIGTERM to" in x and "SIGKILL to any left after 2 s" in x for x in lines), lines
        assert any("waiting for the driver to release VRAM: 1.0 GiB held" in x for x in lines), lines
        assert _gone(child)
        cancel = run_cli("cancel", "kill", info.run_id)
        assert cancel.returncode == 0 and "kill is being cancelled" in cancel.stdout, cancel.stdout
        rest, _ = kill.communicate(timeout=120)
        lines += rest.splitlines()
        assert kill.returncode == 1, lines
        (verdict,) = [x for x in lines if x.startswith(("ok:", "refused:", "cancelled"))]
        assert verdict.startswith("cancelled the wait for VRAM after"), lines
        assert "gone, but the driver still holds 1.0 GiB for the run (release not confirmed)" in verdict
        assert not any("{" in x or "[" in x for x in lines if x.startswith(("  before:", "  after:")))
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_kill_says_one_verdict_and_exits_by_it(trhome: Path, tmp_path: Path) -> None:
    info = launch([sys.executable, "-c", "pass"], LaunchOptions(linger_s=120), cwd=str(tmp_path))
    wait_for(lambda: status(info)["state"] == "exited", timeout=60, what="the trainer exits 0")
    # Nothing left of the attempt: the kill only confirms the driver let go, and says so once.
    done = run_cli("kill", info.run_id, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused" not in done.stdout, done.stdout
    (verdict,) = [x for x in done.stdout.splitlines() if x.startswith(("ok:", "refused", "kill refused"))]
    assert verdict.startswith("ok: nothing left to kill"), done.stdout
    assert "nothing of process group" in done.stdout
    # A refusal: said once, exit 1.
    done = run_cli("kill", info.run_id, "--finding", "DEAD:trainer", "--yes")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("kill refused: finding 'DEAD:trainer' is not open"), done.stdout
    assert "refused: kill refused" not in done.stdout
