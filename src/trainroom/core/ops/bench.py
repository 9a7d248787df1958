"""Matmul TFLOPS on one device, with a verdict against a floor for its class.

A wedge detector: a GPU that does more than 2 TFLOPS is not the problem (an RTX 3060 held by
a zombie context did far less), so look elsewhere. The floors below are wedge detectors, well
under what a healthy part of each class reaches, not performance targets.

The measurement imports torch, so it runs in a short-lived subprocess:
`python -m trainroom.core.ops.bench --device cpu|cuda:N [--seconds S] --json`; the keeper and the CLI
call `run_bench`, which starts it and decodes its JSON into a BenchResult.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from typing import Any

import msgspec

from trainroom.core.health.gpufaults import throttle_words
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.samples import GpuSample
from trainroom.core.vocab import BenchVerdict, FloorSource

DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
# (name pattern, device class, floor in TFLOPS); the first match wins.
GPU_FLOORS: list[tuple[str, str, float]] = [
    (r"\b(GH|H|B)\d00\b|\bH800\b", "Hopper/Blackwell data-centre GPU", 100.0),
    (r"\bA100\b|\bA800\b|\bH20\b", "Ampere data-centre GPU", 50.0),
    (r"RTX (40|50)\d\d|\bL40|\bL4\b|A6000|RTX 6000", "Ada/Blackwell workstation or desktop GPU", 10.0),
    (r"", "GPU (RTX 3060 class)", 2.0),  # a zombie-held RTX 3060 did far less
]
CPU_FLOOR = ("CPU", 0.005)  # 5 GFLOPS fp32: a shared two-core VM does several times that
DEFAULT_SECONDS = 1.0
DEFAULT_TIMEOUT_S = 120.0


class BenchResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One bench run: the figures and the verdict (`ok` False: it could not measure, `error` says why)."""

    ok: bool
    device: str
    error: str | None = None
    device_name: str | None = None
    device_class: str | None = None
    dtype: str | None = None
    n: int | None = None
    iterations: int | None = None
    seconds: float | None = None  # measured
    requested_seconds: float | None = None
    tflops: float | None = None
    floor_tflops: float | None = None
    floor_source: FloorSource = "class"
    verdict: BenchVerdict | None = None
    message: str = ""
    threads: int | None = None
    torch: str | None = None
    # What held the GPU's clocks down as it measured (NVML's clock event reasons), in words: the
    # likely reason for a figure below its floor. None: nothing did, or not read.
    throttled: str | None = None

    @property
    def passed(self) -> bool:
        """Measured and at or above the floor: what exit code 0 means."""
        return self.ok and self.verdict == "ok"

    def as_dict(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self)
        assert isinstance(out, dict)
        return out


def failed(device: str, error: str) -> BenchResult:
    return BenchResult(ok=False, device=device, error=error)


def floor_for(device_type: str, name: str) -> tuple[str, float]:
    """The device class and its TFLOPS floor."""
    if device_type == "cpu":
        return CPU_FLOOR
    for pattern, cls, floor in GPU_FLOORS:
        if re.search(pattern, name):
            return cls, floor
    raise AssertionError("the last GPU pattern matches everything")


def verdict(tflops: float, cls: str, floor: float) -> tuple[BenchVerdict, str]:
    if tflops >= floor:
        return (
            "ok",
            f"above the {floor:g} TFLOPS floor of its class ({cls}): the hardware is fine, look elsewhere",
        )
    return "slow", (
        f"below the {floor:g} TFLOPS floor of its class ({cls}): the device is slow or wedged (a zombie context "
        f"holding it, another process on it, thermal or power throttling)"
    )


# --------------------------------------------------------------------------- in the subprocess


def measure(device: str = "auto", seconds: float = DEFAULT_SECONDS) -> BenchResult:
    """Time square matmuls on `device` for about `seconds` after a warm-up (imports torch)."""
    import torch

    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return failed(device, "CUDA is not available to torch here")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            return failed(device, f"no such device: {torch.cuda.device_count()} CUDA device(s)")
        dev = torch.device("cuda", index)
        name = torch.cuda.get_device_name(index)
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        n = 4096

        def sync() -> None:
            torch.cuda.synchronize(dev)
    else:
        name = _cpu_name()
        dtype = torch.float32
        n = 1024

        def sync() -> None:
            pass

    try:
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        c = torch.empty(n, n, device=dev, dtype=dtype)
        for _ in range(3):  # warm-up: kernel selection, clocks ramping up, lazy init
            torch.mm(a, b, out=c)
        sync()
        iterations, batch = 0, 1
        start = time.perf_counter()
        while True:
            for _ in range(batch):
                torch.mm(a, b, out=c)
            sync()
            iterations += batch
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
            if elapsed * 8 < seconds:
                batch *= 2  # fewer synchronisations once we know a matmul is quick
    except RuntimeError as exc:  # out of memory on a full device, a lost GPU
        return BenchResult(ok=False, device=str(dev), device_name=name, error=str(exc).splitlines()[0])

    tflops = 2 * n**3 * iterations / elapsed / 1e12
    cls, floor = floor_for(dev.type, name)
    word, text = verdict(tflops, cls, floor)
    return BenchResult(
        ok=True,
        device=str(dev),
        device_name=name,
        device_class=cls,
        dtype=str(dtype).removeprefix("torch."),
        n=n,
        iterations=iterations,
        seconds=round(elapsed, 3),
        requested_seconds=seconds,
        tflops=round(tflops, 4),
        floor_tflops=floor,
        verdict=word,
        message=text,
        threads=torch.get_num_threads() if dev.type == "cpu" else None,
        torch=str(torch.__version__),
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        for line in lines:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return str(platform.processor() or "cpu")


# --------------------------------------------------------------------------- keeper / CLI side


def run_bench(
    device: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    seconds: float = DEFAULT_SECONDS,
    python: str | None = None,
    floor_tflops: float | None = None,
    cancel: threading.Event | None = None,
) -> BenchResult:
    """Run the bench in a subprocess and return its result; never raises.

    `python` is the interpreter that has torch (the trainer's; default ours). Blocking for about
    `seconds` plus torch's import (a few seconds): call it from a worker thread. `floor_tflops`
    (trainroom.toml's [bench]) replaces the device class's floor in the verdict.
    """
    if not DEVICE_RE.match(device):
        return failed(device, f"bad device {device!r}: expected cpu, cuda or cuda:N")
    argv = [python or sys.executable, "-m", "trainroom.core.ops.bench", "--device", device]
    argv += ["--seconds", str(seconds), "--json"]
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        return failed(device, f"cannot start {argv[0]}: {exc.strerror or exc}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if (cancel is not None and cancel.is_set()) or time.monotonic() >= deadline:
                proc.kill()
                proc.communicate()
                if cancel is not None and cancel.is_set():
                    return failed(device, "the bench was cancelled")
                return failed(device, f"the bench did not finish in {timeout:g} s (a wedged device?)")
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    lines = done.stdout.strip().splitlines()
    try:
        result = with_floor(msgspec.json.decode(lines[-1], type=BenchResult), floor_tflops)
    except (IndexError, msgspec.DecodeError, msgspec.ValidationError):
        pass
    else:
        return explain(result, gpu_health() if result.verdict == "slow" and "cuda" in device else None)
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return failed(device, f"the bench failed: {tail}")


def gpu_health() -> GpuSample | None:
    """The driver's view now (the fake NVML where $TRAINROOM_FAKE_NVML names one), or None."""
    probe = GpuProbe()
    try:
        return probe.sample()
    except Exception:
        return None
    finally:
        probe.close()


def explain(result: BenchResult, gpu: GpuSample | None) -> BenchResult:
    """A low figure with the GPU throttled says so: the clocks, not a wedge, explain it."""
    if gpu is None or not gpu.available or result.verdict != "slow":
        return result
    hot = [f"GPU {d.index} {w}" for d in gpu.devices if (w := throttle_words(d)) is not None]
    if not hot:
        return result
    said = "; ".join(hot)
    return msgspec.structs.replace(
        result,
        throttled=said,
        message=f"{result.message.split(': the device is slow')[0]}: throttling explains it ({said})",
    )


def with_floor(result: BenchResult, floor_tflops: float | None) -> BenchResult:
    """The result judged against a configured floor instead of its class's."""
    if floor_tflops is None or not result.ok or result.tflops is None:
        return result
    word, text = verdict(result.tflops, f"{result.device_class or '?'}, set in trainroom.toml", floor_tflops)
    return msgspec.structs.replace(
        result, floor_tflops=floor_tflops, floor_source="trainroom.toml", verdict=word, message=text
    )


def describe(result: BenchResult) -> str:
    """One line for a human."""
    if not result.ok:
        return f"bench on {result.device}: {result.error or 'failed'}"
    return (
        f"{result.device} ({result.device_name}): {result.tflops:.3g} TFLOPS {result.dtype} "
        f"({result.iterations} matmuls of {result.n}x{result.n} in {result.seconds or 0:.2f} s); "
        f"{result.message}"
    )


def device_arg(value: str) -> str:
    if not DEVICE_RE.match(value):
        raise argparse.ArgumentTypeError(f"bad device {value!r}: expected cpu, cuda or cuda:N")
    return value


def seconds_arg(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad duration {value!r}: expected seconds") from None
    if not 0 < s <= 60:
        raise argparse.ArgumentTypeError(f"bad duration {value!r}: expected 0 < seconds <= 60")
    return s


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """--device and --seconds, for a `bench` verb defined elsewhere (the keeper-bound one)."""
    parser.add_argument(
        "--device",
        type=device_arg,
        default="auto",
        help="cpu, cuda or cuda:N (default: cuda:0 if there is one)",
    )
    parser.add_argument(
        "--seconds",
        type=seconds_arg,
        default=None,
        help="timed duration (default: [bench] seconds in trainroom.toml, else 1)",
    )


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device_options(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def main(argv: list[str] | None = None) -> int:
    """The subprocess entry: measures in this process."""
    parser = argparse.ArgumentParser(prog="python -m trainroom.core.ops.bench")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        result = measure(args.device, args.seconds or DEFAULT_SECONDS)
    except ImportError as exc:
        result = failed(args.device, f"torch is not importable here: {exc}")
    print(msgspec.json.encode(result).decode() if args.json else describe(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
