"""`trainroom demo --device cuda[:N]`: the argument reaches the trainer, the GPU faults leave the
fake driver for real CUDA processes, and where torch has no CUDA the demo refuses in one line
(this machine's torch is a CPU build: the refusal is tested for real here)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainroom.core.demo.launcher import add_demo_parser, cuda_refusal, demo_command, demo_options
from trainroom.core.ops.doctor import TorchView, torch_view


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    add_demo_parser(sub, lambda _a: 0)
    return ap.parse_args(["demo", *argv])


def test_the_device_reaches_the_trainer_and_the_gpu_faults_leave_the_fake_driver() -> None:
    cpu = _args("--fault", "ghost-memory")
    assert cpu.device == "cpu" and "--device" not in demo_command(cpu)
    assert demo_options(cpu).fake_nvml is True
    gpu = _args("--device", "cuda:1", "--fault", "ghost-memory")
    cmd = demo_command(gpu)
    assert cmd[cmd.index("--device") + 1] == "cuda:1" and cmd[1:3] == ["-m", "trainroom.core.demo.train"]
    assert demo_options(gpu).fake_nvml is False  # the real driver lists the real ghost
    ranks = demo_command(_args("--device", "cuda", "--ranks", "2"))
    assert "torch.distributed.run" in ranks and ranks[ranks.index("--device") + 1] == "cuda"


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "cuda0", "cpu:0"])
def test_a_device_that_is_not_cpu_or_cuda_is_a_usage_error(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _args("--device", bad)
    assert exc.value.code == 2 and "expected cpu, cuda or cuda:N" in capsys.readouterr().err


def test_each_reason_torch_cannot_train_on_the_gpu_is_one_line() -> None:
    py = "/usr/bin/python3"
    assert cuda_refusal("cpu", TorchView(python=py)) is None
    missing = cuda_refusal("cuda", TorchView(python=py, error="ModuleNotFoundError: No module named 'torch'"))
    assert missing == (
        f"--device cuda needs torch with CUDA; {py} cannot import torch (ModuleNotFoundError: No module named 'torch')"
    )
    cpu_build = TorchView(python=py, importable=True, version="2.11.0+cpu")
    assert (
        cuda_refusal("cuda:0", cpu_build)
        == f"--device cuda:0 needs torch with CUDA; torch 2.11.0+cpu in {py} is a CPU build"
    )
    no_gpu = TorchView(python=py, importable=True, version="2.11.0+cu130", cuda_build="13.0")
    assert (
        cuda_refusal("cuda", no_gpu) == f"--device cuda: torch 2.11.0+cu130 in {py} (CUDA 13.0) sees no GPU"
    )
    one = TorchView(
        python=py,
        importable=True,
        version="2.11.0+cu130",
        cuda_build="13.0",
        cuda_available=True,
        device_count=1,
    )
    assert cuda_refusal("cuda:0", one) is None and cuda_refusal("cuda", one) is None
    assert (
        cuda_refusal("cuda:1", one)
        == f"--device cuda:1: torch 2.11.0+cu130 in {py} sees 1 GPU(s), so no device 1"
    )


def test_without_cuda_in_torch_the_demo_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    if torch_view(sys.executable).cuda_available:
        pytest.skip("this torch has CUDA: the refusal is for a machine without it")
    done = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "demo", "--device", "cuda", "--no-tui"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TRAINROOM_HOME": str(tmp_path)},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainroom demo: --device cuda"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing launched


def test_the_demo_model_makes_every_tensor_on_its_inputs_device() -> None:
    """The causal mask and the position ids follow the input: the meta device stands in for a GPU
    here (a tensor made on the CPU beside it is refused, as CUDA refuses it)."""
    torch = pytest.importorskip("torch")
    from trainroom.core.demo.model import CharGPT

    model = CharGPT(45, 64, 2, 2, 32).to("meta")
    out = model(torch.zeros((4, 32), dtype=torch.long, device="meta"))
    assert out.shape == (4, 32, 45) and out.device.type == "meta"
