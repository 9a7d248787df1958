"""`trainroom doctor` as a user runs it: the real CLI in a subprocess, on this machine (no NVIDIA
driver here: NVML reads as a clean degraded), and against the fake NVML the keeper would load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pynvml
import pytest

from tests.support.helpers import run_cli
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario

REPORT_KEYS = {
    "ok",
    "gpu_needed",
    "gpu_needed_why",
    "project_dir",
    "state_dir",
    "python",
    "ckpt_root",
    "checks",
    "devices",
}
CHECK_KEYS = {"name", "status", "detail", "fix", "needed", "facts"}
CHECKS = [
    "state_dir",
    "config",
    "nvml",
    "cuda",
    "gpu_health",
    "wsl",
    "ckpt_fs",
    "disk",
    "host_ram",
    "reclaim",
    "stacks",
    "ssh",
]


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _doctor(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    done = run_cli("doctor", *args, "--project", str(cwd) if cwd else os.getcwd(), timeout=180)
    return done.returncode, done.stdout, done.stderr


def _carrying(home: Path) -> list[int]:
    out = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("TRAINROOM_HOME") == str(home) and p.pid != os.getpid():
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


@pytest.mark.skipif(
    _has_driver(), reason="this machine has an NVIDIA driver: the no-driver path cannot be shown"
)
def test_doctor_json_on_this_machine_exits_0_with_the_documented_keys(trhome: Path, tmp_path: Path) -> None:
    code, out, err = _doctor("--json", cwd=tmp_path)
    assert code == 0, out + err
    report = json.loads(out)
    assert set(report) == REPORT_KEYS and report["ok"] is True
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert all(
        set(c) == CHECK_KEYS and c["status"] in ("ok", "degraded", "missing") for c in report["checks"]
    )
    assert report["state_dir"] == str(trhome) and report["project_dir"] == str(tmp_path)
    nvml = report["checks"][2]
    assert (nvml["status"], nvml["detail"], nvml["needed"]) == (
        "degraded",
        "NVML Shared Library Not Found",
        False,
    )
    assert report["gpu_needed"] is False and report["devices"] == []
    assert _carrying(trhome) == []  # doctor leaves nothing running
    # The same as text: one line per check, the verdict last.
    code, out, err = _doctor(cwd=tmp_path)
    lines = out.splitlines()
    assert code == 0 and err == ""
    nvml_line = next(line for line in lines if line.startswith("nvml "))
    assert nvml_line.split(None, 1)[1] == "degraded: NVML Shared Library Not Found"
    assert lines[-1].startswith("nothing the run needs is missing (exit 0)")


def test_doctor_with_the_fake_gpu_and_a_cpu_torch_exits_1_unless_told_cpu(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees CUDA: the missing-CUDA path cannot be shown")
    scenario = tmp_path / "gpu.json"
    write_scenario(
        scenario,
        {
            "driver_version": "560.94",
            "devices": [{"name": "NVIDIA GeForce RTX 3060", "total_bytes": 12 << 30}],
        },
    )
    monkeypatch.setenv(FAKE_NVML, str(scenario))
    code, out, err = _doctor("--json", cwd=tmp_path)
    assert code == 1, out + err
    report = json.loads(out)
    assert report["gpu_needed"] is True and report["devices"][0]["name"] == "NVIDIA GeForce RTX 3060"
    assert [c["name"] for c in report["checks"] if c["status"] == "missing"] == ["cuda"]
    nvml = report["checks"][2]
    assert nvml["facts"]["fake"] is True
    assert nvml["detail"].startswith(
        "fake NVML ($TRAINROOM_FAKE_NVML): driver 560.94; #0 NVIDIA GeForce RTX 3060 12.0 GiB"
    )
    code, out, _ = _doctor("--cpu", cwd=tmp_path)
    assert code == 0 and "the run does not need a GPU: told so (--cpu)" in out


def test_a_config_launch_would_refuse_is_missing(trhome: Path, tmp_path: Path) -> None:
    (tmp_path / "trainroom.toml").write_text("[kill]\ngrace_s = -1\n")
    code, out, _ = _doctor("--json", "--cpu", cwd=tmp_path)
    report = json.loads(out)
    config = report["checks"][1]
    assert code == 1 and config["status"] == "missing" and "kill.grace_s" in config["detail"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--python", "/nonexistent/python"),
            "trainroom: error: --python /nonexistent/python: not an executable interpreter",
        ),
        (("--project", "/nonexistent/dir"), "trainroom: error: --project /nonexistent/dir: not a directory"),
        (("--gpu", "--cpu"), "argument --cpu: not allowed with argument --gpu"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(trhome: Path, args: tuple[str, ...], said: str) -> None:
    done = run_cli("doctor", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert said in done.stderr and "Traceback" not in done.stderr
