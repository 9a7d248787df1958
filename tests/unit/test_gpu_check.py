"""scripts/gpu_check.py, the GPU acceptance script, where it can run without a GPU: its NVML checks
against the fake at the pynvml boundary (the v3 -> v2 -> v1 ladder, the probe cycle's cost), the
real pynvml's no-driver path, the report's format, the whole script as a subprocess (the CUDA
checks say "skipped: no CUDA device"), and its clean-up of real processes it started."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import msgspec
import psutil
import pynvml
import pytest

from tests.support.run_builder import RunBuilder
from tests.support.waiting import wait_for
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario
from trainroom.core.probes.gpu import PROCESS_FUNCTIONS, GpuProbe
from trainroom.core.probes.leftovers import run_leftovers

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
GIB = 1 << 30


def _load() -> ModuleType:
    # As `python scripts/gpu_check.py` runs it: its own directory first on the path (its session module).
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # msgspec resolves the Structs' annotations through it
    spec.loader.exec_module(module)
    return module


gc = _load()
from gpu_check_session import Session, carrying  # noqa: E402 - found once _load() put scripts/ on the path


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _scenario(path: Path, **extra: object) -> FakeNvml:
    write_scenario(
        path,
        {
            "driver_version": "560.94",
            "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 2 * GIB}],
            "processes": [{"pid": os.getpid(), "used_bytes": 2 * GIB}],
            **extra,
        },
    )
    return FakeNvml(path)


# --------------------------------------------------------------------------- NVML checks against the fake


@pytest.mark.parametrize(
    ("api", "uses"),
    [("v3", "v3"), ("v2", "v2"), ("v1", "v1")],
)
def test_process_call_ladder_reports_each_variant_and_the_one_the_probe_uses(
    tmp_path: Path, api: str, uses: str
) -> None:
    nvml = _scenario(tmp_path / "gpu.json", process_api=api)
    o = gc.check_process_calls(nvml, 0)
    assert o.result == "pass", o
    order = ["v3", "v2", "v1"]
    for v in order:
        said = o.figures[v]
        if order.index(v) < order.index(uses):
            assert said == "not in this driver (FunctionNotFound)"
        else:
            assert said.startswith("ok: 1 process(es) in ")
    assert o.detail.endswith(f"the keeper's probe uses {uses}") and o.figures["probe_notes"] is None


def test_process_calls_that_all_fail_are_a_failure(tmp_path: Path) -> None:
    errors = dict.fromkeys(PROCESS_FUNCTIONS, pynvml.NVML_ERROR_NOT_SUPPORTED)
    o = gc.check_process_calls(_scenario(tmp_path / "gpu.json", errors=errors), 0)
    assert o.result == "fail" and "compute processes unavailable" in o.detail
    assert o.figures["v3"] == f"error: {pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)}"
    assert gc.check_process_calls(_scenario(tmp_path / "gpu.json"), 3).result == "fail"  # no device 3


def test_probe_cycle_cost_against_the_fake(tmp_path: Path) -> None:
    nvml = _scenario(tmp_path / "gpu.json")
    o = gc.check_probe_cycle(nvml, cycles=20)
    assert o.result == "pass" and o.figures["cycles"] == 20
    assert 0 < o.figures["median_ms"] <= o.figures["p95_ms"] <= o.figures["max_ms"]
    assert "(1 device(s), 1 compute process(es))" in o.detail
    # Every cycle reached the driver: init once, then the same calls each time.
    assert nvml.init_calls == 1 and nvml.calls > 20 * 5


def test_nvml_init_passes_skips_without_a_library_and_fails_on_a_broken_driver(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    o = gc.check_nvml_init(_scenario(path))
    assert o.result == "pass" and o.figures["driver"] == "560.94" and "#0 NVIDIA H200 141 GiB" in o.detail
    write_scenario(path, {"init_error": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
    assert (
        gc.check_nvml_init(FakeNvml(path)).detail
        == "skipped: no NVIDIA driver (NVML Shared Library Not Found)"
    )
    write_scenario(path, {"init_error": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    assert gc.check_nvml_init(FakeNvml(path)).result == "fail"
    write_scenario(path, {"init_error": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
    assert gc.check_probe_cycle(FakeNvml(path)).result == "skip"
    assert gc.check_process_calls(FakeNvml(path), 0).result == "skip"


@pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")
def test_the_real_pynvml_without_a_driver_skips() -> None:
    assert gc.check_nvml_init(pynvml).detail == "skipped: no NVIDIA driver (NVML Shared Library Not Found)"


def _status(run_bytes: int | None, reserved: int | None, used: int, *findings: str) -> dict[str, object]:
    vram = {
        "driver_available": True,
        "driver_reason": None,
        "driver_run_bytes": run_bytes,
        "driver_used_bytes": used,
        "allocator_allocated_bytes": reserved,
        "allocator_reserved_bytes": reserved,
    }
    return {"vram": vram, "findings": [{"code": c, "evidence": {}} for c in findings]}


def test_the_trainer_verdicts_on_the_driver_and_allocator_views(tmp_path: Path) -> None:
    me, mib = os.getpid(), 1 << 20
    nvml = _scenario(tmp_path / "gpu.json", processes=[{"pid": me, "used_bytes": 1536 * mib}])
    vram, ratio = gc.judge_trainer(nvml, me, _status(1536 * mib, GIB, 2 * GIB))
    assert (vram.result, ratio.result) == ("pass", "pass")
    assert vram.detail == f"the driver attributes 1.5 GiB to pid {me}; status says 1.5 GiB for the run"
    assert ratio.figures["ratio"] == 1.5 and ratio.figures["basis"] == "per-process"
    assert "the CUDA context's share 512 MiB" in ratio.detail and ratio.detail.endswith("no GHOST_MEMORY")
    # The keeper disagreeing with the driver, or calling a healthy trainer a ghost, fails.
    assert gc.judge_trainer(nvml, me, _status(4 * GIB, GIB, 4 * GIB))[0].result == "fail"
    assert gc.judge_trainer(nvml, me, _status(1536 * mib, GIB, 2 * GIB, "GHOST_MEMORY"))[1].result == "fail"
    # Not listed at all; per-process N/A (device totals stand in); no driver view in the keeper.
    assert gc.judge_trainer(nvml, 4242, _status(None, GIB, 2 * GIB))[0].result == "fail"
    write_scenario(
        tmp_path / "gpu.json",
        {"devices": [{"used_bytes": 2 * GIB}], "processes": [{"pid": me, "used_bytes": None}]},
    )
    na, by_device = gc.judge_trainer(FakeNvml(tmp_path / "gpu.json"), me, _status(None, GIB, 2 * GIB))
    assert na.result == "pass" and "N/A" in na.detail
    assert by_device.figures["basis"] == "device" and by_device.figures["ratio"] == 2.0
    gone = _status(None, GIB, 0)
    gone["vram"] = {**gone["vram"], "driver_available": False, "driver_reason": "driver view unavailable: x"}  # type: ignore[dict-item]
    assert [o.result for o in gc.judge_trainer(nvml, me, gone)] == ["fail", "fail"]


def test_report_format() -> None:
    report = gc.Report(
        home="/tmp/x",
        device="NVIDIA H200",
        driver="560.94",
        torch="2.5.1",
        python="py",
        seconds=1.25,
        outcomes=[
            gc.passed("probe_cycle", True, "median 0.10 ms", median_ms=0.1, p95_ms=None),
            gc.passed("kill", False, "still alive: [1]"),
            gc.skipped("bench", "no CUDA device"),
        ],
    )
    assert gc.render(report) == [
        "gpu_check: NVIDIA H200, driver 560.94, torch 2.5.1 in py; 1.2 s",
        "PASS  probe_cycle     median 0.10 ms",
        " " * 22 + "median_ms=0.1",
        "FAIL  kill            still alive: [1]",
        "SKIP  bench           skipped: no CUDA device",
        "1 pass, 1 fail, 1 skip",
    ]
    assert [o.name for o in report.failed] == ["kill"]


# --------------------------------------------------------------------------- the script, whole


def test_the_script_against_the_fake_passes_nvml_skips_cuda_and_leaves_nothing(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees CUDA: the script would run the CUDA checks for real")
    scenario = tmp_path / "gpu.json"
    _scenario(scenario, process_api="v2")
    env = {**os.environ, FAKE_NVML: str(scenario)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    results = {o["name"]: o for o in report["outcomes"]}
    health = ["kernel_log", "gpu_health", "xid_events", "power_cap"]
    assert list(results) == ["nvml_init", "process_calls", "probe_cycle", *health, *gc.CUDA_CHECKS, "cleanup"]
    # The fake device has no health key (every figure NotSupported): nothing to judge, said so.
    assert results["gpu_health"]["detail"] == "skipped: device 0 gave no health figure"
    assert results["xid_events"]["result"] == "pass"
    assert results["power_cap"]["detail"] == "skipped: no CUDA device"
    assert [results[n]["result"] for n in ("nvml_init", "process_calls", "probe_cycle", "cleanup")] == [
        "pass"
    ] * 4
    assert results["process_calls"]["figures"]["v3"] == "not in this driver (FunctionNotFound)"
    for name in gc.CUDA_CHECKS:
        assert results[name]["result"] == "skip"
        assert results[name]["detail"].startswith("skipped: no CUDA device (torch ")
    assert report["driver"] == "560.94" and report["device"] is None
    assert not Path(report["home"]).exists() and carrying(Path(report["home"])) == []


def test_cleanup_ends_a_stopped_process_outside_any_run_that_carries_the_home() -> None:
    home = Path(tempfile.mkdtemp(prefix="trgc", dir="/tmp"))
    env = {**os.environ, "TRAINROOM_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True
    )
    try:
        wait_for(lambda: carrying(home), timeout=30, what="the process to show its environment")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, timeout=30)
        session = Session(home, 60.0, sys.executable)
        assert session.cleanup() == []
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        home.rmdir()


# --------------------------------------------------------------------------- what orphan_context will meet


def test_a_stopped_straggler_that_holds_a_context_after_its_attempt_died_is_an_orphan(tmp_path: Path) -> None:
    """What gpu_check's orphan_context meets on a real GPU: a live, stopped process of the dead
    attempt (found by the run id in its environment) still listed by the driver. It is an
    ORPHAN_CONTEXT whose kill targets exactly that process."""
    b = RunBuilder()
    b.run.run_id = f"r-straggler-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "TRAINROOM_RUN": b.run.run_id, "TRAINROOM_ATTEMPT": "1"}
    straggler = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True
    )
    try:
        os.kill(straggler.pid, signal.SIGSTOP)
        wait_for(lambda: psutil.Process(straggler.pid).status() == psutil.STATUS_STOPPED, timeout=30)
        path = tmp_path / "gpu.json"
        write_scenario(
            path,
            {
                "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": GIB}],
                "processes": [{"pid": straggler.pid, "used_bytes": GIB}],
            },
        )
        probe = GpuProbe(FakeNvml(path))
        b.start(pid=_pid_that_cannot_exist())
        b.steps(10, reserved=GIB)
        b.end(exit_signal=9)
        leftovers = wait_for(lambda: run_leftovers(b.run.run_id, b.run.created, None), timeout=30)
        wd = Watchdog()
        for _ in range(3):
            b.now += 1.0
            v = wd.evaluate(b.run, WatchContext(alive=False, gpu=probe.sample(), leftovers=leftovers), b.now)
        (f,) = [f for f in v.findings if f.code == "ORPHAN_CONTEXT"]
        assert f.evidence["pid"] == straggler.pid and f.evidence["leftover"] is True
        assert f.action == "kill" and f.target is not None and f.target.pids == [straggler.pid]
        assert "attempt 1" in f.message and "attempt 1" in f.target.label
    finally:
        straggler.kill()
        straggler.wait()


def _pid_that_cannot_exist() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


MIB = 1 << 20
H200 = {"name": "NVIDIA H200", "total_bytes": 141 * GIB, "util_percent": 0}


def test_the_kill_check_judges_like_the_product_on_a_615_mib_floor(tmp_path: Path) -> None:
    # The product's own kill of a real group, the driver as the H200 showed it: the trainer's row
    # while it lives, then no process and the idle 615 MiB. The check passes on the product's
    # verdict and the basis it names; the old absolute reading (615 MiB > 512 MiB) fails.
    from trainroom.core.ops.kill import execute_kill, plan_kill
    from trainroom.core.ops.vram import run_vram_probe

    path = tmp_path / "gpu.json"
    leader = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        process_group=0,
        env=dict(os.environ, TRAINROOM_RUN="gc-kill"),
    )
    try:
        write_scenario(
            path,
            {
                "devices": [H200 | {"used_bytes": 2458 * MIB}],
                "processes": [{"pid": leader.pid, "used_bytes": 1843 * MIB}],
            },
        )
        plan = plan_kill(leader.pid, leader.pid, psutil.Process(leader.pid).create_time(), run_id="gc-kill")
        probe = run_vram_probe(GpuProbe(FakeNvml(path)), [leader.pid])
        assert probe() is not None  # the trainer's row seen while it lives

        def released() -> None:
            leader.wait(timeout=30)
            write_scenario(path, {"devices": [H200 | {"used_bytes": 615 * MIB}], "processes": []})

        driver = threading.Thread(target=released, daemon=True)
        driver.start()
        r = execute_kill(plan, grace_s=2, vram_probe=probe, vram_timeout_s=50, vram_poll_s=0.05)
        driver.join(timeout=30)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()
    o = gc.judge_kill(r.ok, r.message, r.before, r.after, [], cpu=False)
    assert o.result == "pass", o.detail
    assert o.figures["vram_basis"] == "per-process" and o.figures["vram_after_bytes"] == 0
    assert o.figures["vram_device_bytes"] == 615 * MIB and "judged on per-process rows" in o.detail
    # What the H200 run saw: the keeper's failure (no basis, 615 MiB "held") is a failed check.
    old = {"vram_bytes": 615 * MIB, "vram_wait_s": 50.0}
    assert (
        gc.judge_kill(False, "the driver still holds 615 MiB after 50 s", r.before, old, [], cpu=False).result
        == "fail"
    )
    assert gc.judge_kill(True, "ok", r.before, r.after, [4242], cpu=False).result == "fail"


def test_the_ghost_check_asserts_the_attribution(tmp_path: Path) -> None:
    me = os.getpid()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "holder"])
    try:
        path = tmp_path / "gpu.json"
        rows = [{"pid": me, "used_bytes": 1843 * MIB}, {"pid": holder.pid, "used_bytes": 2788 * MIB}]
        write_scenario(path, {"devices": [H200 | {"used_bytes": 5246 * MIB}], "processes": rows})
        probe = GpuProbe(FakeNvml(path))
        b = RunBuilder()
        b.start(pid=me)
        b.steps(20, reserved=1097 * MIB)
        wd = Watchdog()
        for _ in range(2):
            v = wd.evaluate(
                b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me, holder.pid])), b.now
            )
        (f,) = [msgspec.to_builtins(x) for x in v.findings if x.code == "GHOST_MEMORY"]
    finally:
        holder.kill()
        holder.wait()
    o = gc.judge_ghost(f, holder.pid)
    assert o.result == "pass", o.detail
    assert o.figures["holder_bytes"] == 2788 * MIB and o.figures["unexplained_bytes"] == 0
    # The message the H200 run got (the driver blamed, no pid named, no kill) fails the check.
    blamed = dict(
        f,
        action=None,
        target=None,
        evidence={**f["evidence"], "holders": []},
        message="... contexts the driver has not released (`nvidia-smi --gpu-reset` ...)",
    )
    bad = gc.judge_ghost(blamed, holder.pid)
    assert bad.result == "fail" and "not named among the holders" in bad.detail
    assert gc.judge_ghost(None, holder.pid).result == "fail"
