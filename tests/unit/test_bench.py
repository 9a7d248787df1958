"""The matmul bench: a real run on CPU in its subprocess, the CLI verb, and the verdict floors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainroom.core.cli.main import build_parser
from trainroom.core.ops import bench as bench

KEEPER_SIDE = """
import json, sys
from trainroom.core.ops import bench
result = bench.run_bench("cpu", seconds=0.3)
print(json.dumps({"result": result.as_dict(), "torch_imported": "torch" in sys.modules}))
"""


def test_cpu_bench_runs_in_a_subprocess_and_gives_a_verdict() -> None:
    # Run as the keeper would: a process without torch, which must stay without it.
    done = subprocess.run([sys.executable, "-c", KEEPER_SIDE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["torch_imported"] is False
    result = out["result"]
    assert result["ok"] is True, result
    assert result["device"] == "cpu" and result["dtype"] == "float32"
    assert result["iterations"] >= 1 and result["seconds"] >= 0.3
    assert result["tflops"] > 0
    assert result["floor_tflops"] == bench.CPU_FLOOR[1]
    assert result["verdict"] == ("ok" if result["tflops"] >= result["floor_tflops"] else "slow")
    assert "TFLOPS" in bench.describe(bench.BenchResult(**result))


def test_bench_verb_prints_json(trhome: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No live run under this home: the verb benches here, without a keeper.
    args = build_parser().parse_args(["bench", "--device", "cpu", "--seconds", "0.2", "--json"])
    code = args.func(args)
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is True and printed["device"] == "cpu"
    assert code == (0 if printed["verdict"] == "ok" else 1)


def test_cuda_without_a_gpu_is_a_clear_error_not_a_traceback() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU message cannot be seen here")
    result = bench.run_bench("cuda:0", seconds=0.1)
    assert result == bench.BenchResult(ok=False, device="cuda:0", error="CUDA is not available to torch here")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0"])
def test_bad_device_is_refused_before_anything_starts(device: str) -> None:
    assert "bad device" in (bench.run_bench(device).error or "")
    done = subprocess.run(
        [sys.executable, "-m", "trainroom.core.ops.bench", "--device", device], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "bad device" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("name", "floor"),
    [
        ("NVIDIA GeForce RTX 3060", 2.0),
        ("NVIDIA GeForce RTX 4090", 10.0),
        ("NVIDIA A100-SXM4-80GB", 50.0),
        ("NVIDIA H200", 100.0),
        ("NVIDIA GH200 480GB", 100.0),
        ("Tesla T4", 2.0),
    ],
)
def test_gpu_floors_by_class(name: str, floor: float) -> None:
    assert bench.floor_for("cuda", name)[1] == floor


def test_verdict_on_either_side_of_the_seeds_floor() -> None:
    cls, floor = bench.floor_for("cuda", "NVIDIA GeForce RTX 3060")
    assert bench.verdict(2.5, cls, floor)[0] == "ok"
    assert "look elsewhere" in bench.verdict(2.5, cls, floor)[1]
    assert bench.verdict(0.4, cls, floor)[0] == "slow"
    assert "wedged" in bench.verdict(0.4, cls, floor)[1]


def _bench_cli(cwd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "bench", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def test_a_floor_set_in_trainroom_toml_judges_the_result(trhome, tmp_path) -> None:
    # No live keeper: the verb benches here, under the config of the dir it runs in.
    (tmp_path / "trainroom.toml").write_text("[bench]\nfloor_tflops = 1e6\nseconds = 0.2\n")
    done = _bench_cli(tmp_path, "--json")
    assert done.returncode == 1, done.stderr  # below the floor
    out = json.loads(done.stdout)
    assert out["ok"] is True and out["floor_tflops"] == 1e6 and out["floor_source"] == "trainroom.toml"
    assert out["verdict"] == "slow" and "set in trainroom.toml" in out["message"]
    assert out["requested_seconds"] == 0.2  # [bench] seconds applied, not the 1 s default

    (tmp_path / "trainroom.toml").write_text("[bench]\nfloor_tflops = 0.0\n")
    done = _bench_cli(tmp_path, "--json", "--seconds", "0.1")
    assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "ok"


def test_a_bad_bench_section_names_the_key_and_the_file(trhome, tmp_path) -> None:
    (tmp_path / "trainroom.toml").write_text("[bench]\nseconds = -1\n")
    done = _bench_cli(tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "bench.seconds" in line and "trainroom.toml" in line
