"""What the first real GPU run (an H200 with persistence mode) showed, replayed end to end: real
keepers, real trainer processes on the CPU, and the driver's view from the fake NVML at the
pynvml boundary (the one stand-in on a machine without a GPU), written by the trainer as its
rows change and, once a process is gone, by the test as the driver would.

- An idle H200 holds 615 MiB with no process at all: the floor is recorded at launch, and a kill
  returns at once, exit 0, saying the VRAM was released on per-process rows.
- Once the attempt ended, status's allocator fields and driver_over_allocator are null.
- A second process of the trainer's group holding memory with no allocator: GHOST_MEMORY names
  it (pid, command line, bytes), and its targeted kill frees it while the trainer trains on.
"""

from __future__ import annotations

import json
import os
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

MIB, GIB = 1 << 20, 1 << 30
FLOOR = 615 * MIB  # the idle H200's used memory, persistence mode on, no process
TRAINER = 1843 * MIB  # the trainer's row as the driver listed it
RESERVED = 1097 * MIB  # its allocator's reserve (1.68x: the CUDA context's share)
HOLDER = 2788 * MIB  # 2 GiB and a context of its own
START_S = 60.0


def _h200(used: int) -> dict[str, Any]:
    return {"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": used, "util_percent": 0}


# A trainer on the CPU that plays one on the H200: it reports its allocator's figures and writes
# the driver's rows for itself (and, with an argument, for a child of its group that holds memory
# and reports no allocator, as a DataLoader worker that touched CUDA does) on every step.
TRAINER_SCRIPT = """
    import json, os, subprocess, sys, time
    from trainroom.core.sdk import reporter
    MIB = 1 << 20
    scenario, holder_file = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    holder = None
    if holder_file:
        holder = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "dataloader-worker-0"],
            stdin=subprocess.DEVNULL,
        )
        with open(holder_file, "w") as f:
            f.write(str(holder.pid))
    rep = reporter.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rows = [{"pid": os.getpid(), "used_bytes": TRAINER_BYTES}]
        if holder is not None and holder.poll() is None:
            rows.append({"pid": holder.pid, "used_bytes": HOLDER_BYTES})
        used = FLOOR_BYTES + sum(r["used_bytes"] for r in rows)
        tmp = scenario + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"devices": [{"name": "NVIDIA H200", "total_bytes": 141 << 30, "used_bytes": used,
                                    "util_percent": 90}], "processes": rows}, f)
        os.replace(tmp, scenario)
        rep.step(step, loss=2.0, alloc=(RESERVED_BYTES, RESERVED_BYTES, RESERVED_BYTES))
        time.sleep(0.05)
"""
for _name, _value in (
    ("TRAINER_BYTES", TRAINER),
    ("HOLDER_BYTES", HOLDER),
    ("FLOOR_BYTES", FLOOR),
    ("RESERVED_BYTES", RESERVED),
):
    TRAINER_SCRIPT = TRAINER_SCRIPT.replace(_name, str(_value))


def _journal(info: runs.RunInfo) -> list[p.Record]:
    return list(read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[runs.RunInfo, Path]:
    gpu = tmp_path / "gpu.json"
    write_scenario(gpu, {"devices": [_h200(FLOOR)], "processes": []})  # the idle H200
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINER_SCRIPT))
    argv = [sys.executable, str(script), str(gpu), *extra]
    return launch(argv, LaunchOptions(linger_s=120), cwd=str(tmp_path)), gpu


def test_a_kill_on_a_615_mib_floor_returns_at_once_released_on_per_process_rows(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info, gpu = _start(tmp_path, monkeypatch)
    d = wait_for(
        lambda: (s := status(info))["vram"]["driver_run_bytes"] == TRAINER and s,
        timeout=START_S,
        what="the trainer's row in status",
    )
    trainer = d["pid"]
    assert d["vram"]["allocator_reserved_bytes"] == RESERVED
    (started,) = [r for r in _journal(info) if isinstance(r, p.AttemptStarted)]
    assert started.vram_floor is not None and started.vram_floor.used_bytes == [FLOOR]

    kill = subprocess.Popen(
        [sys.executable, "-m", "trainroom.cli", "kill", info.run_id, "--grace", "5", "--yes", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    wait_for(lambda: _gone(trainer), timeout=60, what="the trainer gone")
    # The driver lists no process once the trainer is gone; the device keeps its idle floor.
    write_scenario(gpu, {"devices": [_h200(FLOOR)], "processes": []})
    stdout, stderr = kill.communicate(timeout=120)
    assert kill.returncode == 0, stdout + stderr
    out = json.loads(stdout)
    assert out["ok"] and out["after"]["vram_basis"] == "per-process", out["message"]
    assert out["before"]["vram_bytes"] == TRAINER and out["after"]["vram_bytes"] == 0
    assert out["after"]["vram_device_bytes"] == FLOOR
    assert "released, judged on per-process rows: the driver lists no process of the run" in out["message"]

    d = wait_for(lambda: (s := status(info))["state"] == "stopped" and s, timeout=60, what="stopped")
    vram = d["vram"]
    assert vram["driver_over_allocator"] is None
    assert vram["allocator_reserved_bytes"] is None and vram["allocator_allocated_bytes"] is None
    # The dead trainer's last allocator report stays in the run's history.
    steps = [r.msg for r in _journal(info) if isinstance(r, p.Received) and isinstance(r.msg, p.Step)]
    assert steps and steps[-1].alloc_reserved == RESERVED


def test_ghost_memory_names_the_groups_holder_and_its_targeted_kill_frees_it(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder_file = tmp_path / "holder"
    info, _ = _start(tmp_path, monkeypatch, str(holder_file))
    holder = int(
        wait_for(lambda: holder_file.exists() and holder_file.read_text(), timeout=START_S, what="holder")
    )
    d = wait_for(
        lambda: (s := status(info)) and _finding(s, "GHOST_MEMORY") and s,
        timeout=START_S,
        what="GHOST_MEMORY",
    )
    f = _finding(d, "GHOST_MEMORY")
    assert f is not None
    trainer = d["pid"]
    assert os.getpgid(holder) == trainer  # a second process of the trainer's group
    msg = f["message"]
    assert (
        f"pid {holder} (" in msg and "dataloader-worker-0" in msg and "2.7 GiB" in msg and "not a rank" in msg
    )
    assert "DataLoader worker or an async-save child that touched CUDA" in msg
    assert "gpu-reset" not in msg and "nothing of ours holds it" not in msg
    (held,) = f["evidence"]["holders"]
    assert held["pid"] == holder and held["used_bytes"] == HOLDER and held["rank"] is False
    assert held["cmdline"][-1] == "dataloader-worker-0"
    assert f["action"] == "kill" and f["target"]["pids"] == [holder]

    done = run_cli(
        "kill", info.run_id, "--finding", f["ident"], "--grace", "2", "--yes", "--json", timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert [m["pid"] for m in out["plan"]["members"]] == [holder]
    assert out["ok"] and out["after"]["vram_basis"] == "per-process" and out["after"]["vram_bytes"] == 0
    assert _gone(holder) and not _gone(trainer)  # the trainer trains on
    wait_for(lambda: _finding(status(info), "GHOST_MEMORY") is None, timeout=60, what="GHOST_MEMORY cleared")
    assert status(info)["state"] == "running"


def test_the_demos_ghost_memory_is_a_child_of_its_group_named_and_killed(trhome: Path) -> None:
    # `trainroom demo --fault ghost-memory` on the CPU: a real child of the trainer's group, its
    # row from the fake driver (on a GPU the same child holds real CUDA memory).
    info = start_demo(fault="ghost-memory", fault_step=10, step_delay=0.05, ckpt_every=0)
    d = wait_for(
        lambda: (s := status(info)) and _finding(s, "GHOST_MEMORY") and s, timeout=120, what="GHOST_MEMORY"
    )
    f = _finding(d, "GHOST_MEMORY")
    assert f is not None
    (held,) = f["evidence"]["holders"]
    child = held["pid"]
    assert os.getpgid(child) == d["pid"] and held["rank"] is False
    assert f["target"]["pids"] == [child] and "gpu-reset" not in f["message"]
    done = run_cli(
        "kill", info.run_id, "--finding", f["ident"], "--grace", "2", "--yes", "--json", timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _gone(child) and not _gone(d["pid"])
    wait_for(lambda: _finding(status(info), "GHOST_MEMORY") is None, timeout=60, what="GHOST_MEMORY cleared")
