"""probes.gpu: the real pynvml's no-driver path as it is on this machine, and the fake at the
pynvml function boundary for everything a driver would say (the only stand-in the tests use)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest

from tests.support.run_builder import RunBuilder
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.probes import fake_nvml
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario
from trainroom.core.probes.gpu import FOREIGN_NAMESPACE, PER_PROCESS_NA, GpuProbe, load_nvml
from trainroom.core.probes.procs import start_ticks as procs_start_ticks
from trainroom.core.samples import GpuDevice, HostSample, Leftover
from trainroom.core.wire import protocol as p

GIB = 1 << 30


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _pid_that_cannot_exist() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def _device(**kw: Any) -> dict[str, Any]:
    d = {
        "name": "NVIDIA GeForce RTX 3060",
        "total_bytes": 12 * GIB,
        "used_bytes": 4 * GIB,
        "util_percent": 80,
        "power_w": 150.0,
    }
    d.update(kw)
    return d


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.mark.skipif(
    _has_driver(), reason="this machine has an NVIDIA driver: the no-driver path cannot be shown"
)
def test_real_pynvml_without_a_driver_says_unavailable() -> None:
    s = GpuProbe(pynvml).sample(our_pids=[os.getpid()])
    assert s.available is False
    assert s.reason == "driver view unavailable: NVML Shared Library Not Found"
    assert s.devices == [] and s.processes == []


def test_load_nvml_uses_the_fake_only_when_the_env_names_a_scenario(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(fake_nvml.ENV, raising=False)
    assert load_nvml() is pynvml
    monkeypatch.setenv(fake_nvml.ENV, str(tmp_path / "gpu.json"))
    assert load_nvml() is fake_nvml.DEFAULT  # what the module-level functions are bound to


def test_the_fake_raises_the_real_error_classes(tmp_path: Path) -> None:
    nv = FakeNvml(tmp_path / "gpu.json")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    write_scenario(tmp_path / "gpu.json", {"init_error": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND})
    with pytest.raises(pynvml.NVMLError_LibraryNotFound) as info:
        nv.nvmlInit()
    assert info.value.value == 12 and str(info.value) == "NVML Shared Library Not Found"
    assert fake_nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost


def test_a_healthy_sample_per_process(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    other = _pid_that_cannot_exist()
    write_scenario(
        path,
        {
            "devices": [_device()],
            "processes": [{"pid": os.getpid(), "used_bytes": 3 * GIB}, {"pid": other, "used_bytes": GIB}],
        },
    )
    nv = FakeNvml(path)
    probe = GpuProbe(nv, clock=Clock())
    s = probe.sample(our_pids=[os.getpid()])
    assert s.available and s.reason == "" and s.per_process is True and s.t == 101.0
    assert s.devices == [
        GpuDevice(
            index=0,
            name="NVIDIA GeForce RTX 3060",
            used_bytes=4 * GIB,
            total_bytes=12 * GIB,
            util_percent=80,
            power_w=150.0,
            pci_bus_id="0000:01:00.0",  # the fake's default for device 0 (no health keys: NotSupported)
        )
    ]
    mine, gone = s.processes
    assert mine.pid == os.getpid() and mine.ours and mine.exists and mine.used_bytes == 3 * GIB
    assert gone.pid == other and not gone.ours and not gone.exists and gone.state is None
    probe.sample()
    probe.sample()
    assert nv.init_calls == 1  # initialised once, however many samples


def test_per_process_na_is_a_normal_value(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(
        path,
        {
            "devices": [_device()],
            "processes": [
                {"pid": os.getpid(), "used_bytes": None},
                {"pid": os.getppid(), "used_bytes": "ULLONG_MAX"},
            ],
        },
    )
    s = GpuProbe(FakeNvml(path)).sample(our_pids=[os.getpid()])
    assert s.available and s.per_process is False
    assert [x.used_bytes for x in s.processes] == [None, None]
    assert PER_PROCESS_NA in s.notes
    assert s.devices[0].used_bytes == 4 * GIB


def test_older_drivers_fall_back_to_v2_then_v1(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    for api in ("v2", "v1"):
        write_scenario(
            path,
            {"process_api": api, "devices": [_device(processes=[{"pid": os.getpid(), "used_bytes": GIB}])]},
        )
        probe = GpuProbe(FakeNvml(path))
        s = probe.sample(our_pids=[os.getpid()])
        assert [x.pid for x in s.processes] == [os.getpid()] and not s.notes
        expected = {
            "v2": "nvmlDeviceGetComputeRunningProcesses_v2",
            "v1": "nvmlDeviceGetComputeRunningProcesses",
        }
        assert probe._process_fn == expected[api]


def test_one_failing_field_never_breaks_a_sample(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [_device(util_percent=37100, errors={"nvmlDeviceGetPowerUsage": 3})]})
    s = GpuProbe(FakeNvml(path)).sample()
    d = s.devices[0]
    assert s.available and d.power_w is None and d.util_percent is None and d.used_bytes == 4 * GIB
    assert "device 0: power unavailable: Not Supported" in s.notes
    assert any("37100 % dropped" in n for n in s.notes)


def test_driver_not_loaded_then_a_lost_gpu(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(path, {"init_error": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    probe = GpuProbe(FakeNvml(path), retry_init_s=0.0)
    assert probe.sample().reason == "driver view unavailable: Driver Not Loaded"
    write_scenario(
        path, {"devices": [_device()], "errors": {"nvmlDeviceGetCount": pynvml.NVML_ERROR_GPU_IS_LOST}}
    )
    assert probe.sample().reason == "driver view unavailable: GPU is lost"
    write_scenario(path, {"devices": [_device()]})
    assert probe.sample().available is True  # re-initialised after the loss


def test_another_process_drives_the_scenario(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "gpu.json"
    monkeypatch.setenv(fake_nvml.ENV, str(path))
    probe = GpuProbe(load_nvml())
    assert probe.sample().devices == []  # no file yet: a driver with no devices
    code = (
        "import sys; from trainroom.core.probes.fake_nvml import write_scenario; "
        "write_scenario(sys.argv[1], {'devices': [{'name': 'other', 'used_bytes': 7, 'total_bytes': 9, "
        "'util_percent': 100, 'power_w': 60.0}]})"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    d = probe.sample().devices[0]
    assert (d.name, d.used_bytes, d.util_percent, d.power_w) == ("other", 7, 100, 60.0)
    path.write_text("{ torn")  # a writer that does not replace atomically, caught mid-write
    assert probe.sample().devices[0].name == "other"


def test_not_in_the_host_pid_namespace_says_so(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "pid").write_text("")  # any inode but the initial namespace's
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [_device()], "processes": [{"pid": 31337, "used_bytes": GIB}]})
    s = GpuProbe(FakeNvml(path), proc_root=str(proc)).sample()
    assert s.pid_namespace == "container" and FOREIGN_NAMESPACE in s.notes
    b = RunBuilder()
    b.start()
    wd = Watchdog()
    for _ in range(3):
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=s), b.now)
        s = msgspec.structs.replace(s, t=s.t + 1)
    assert all(f.code != "ORPHAN_CONTEXT" for f in v.findings)


# --------------------------------------------------------------------------- through the watchdog


def _run_with_reserved(reserved: int, pid: int) -> RunBuilder:
    b = RunBuilder()
    b.start(pid=pid)
    b.steps(20, reserved=reserved)
    return b


def test_ghost_memory_after_two_probe_cycles_with_both_figures(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    me = os.getpid()
    reserved = 4 * GIB
    write_scenario(
        path,
        {
            "devices": [_device(used_bytes=int(2.1 * reserved))],
            "processes": [{"pid": me, "used_bytes": int(2.1 * reserved)}],
        },
    )
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = _run_with_reserved(reserved, me)
    wd = Watchdog()

    def ctx() -> WatchContext:
        return WatchContext(
            alive=True,
            attempt_pids=[me],
            gpu=probe.sample(our_pids=[me]),
            host=HostSample(t=0.0, available=True, wsl=False, effective_available_bytes=20 * GIB),
        )

    first = wd.evaluate(b.run, ctx(), b.now)
    assert all(f.code != "GHOST_MEMORY" for f in first.findings)
    v = wd.evaluate(b.run, ctx(), b.now)
    f = next(f for f in v.findings if f.code == "GHOST_MEMORY")
    assert f.evidence["basis"] == "per-process" and f.evidence["ratio"] == pytest.approx(2.1, abs=0.01)
    assert "8.4 GiB" in f.message and "4.0 GiB" in f.message and "2.10x" in f.message
    assert f.severity == "warning" and v.state == "running"


def test_ghost_memory_under_wsl_falls_back_to_device_totals_and_advises_a_vm_restart(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    me = os.getpid()
    write_scenario(
        path,
        {"devices": [_device(used_bytes=int(7.5 * GIB))], "processes": [{"pid": me, "used_bytes": None}]},
    )
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = _run_with_reserved(4 * GIB, me)
    wd = Watchdog()
    host = HostSample(t=0.0, available=True, wsl=True, effective_available_bytes=20 * GIB)
    for _ in range(2):
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me]), host=host), b.now)
    f = next(f for f in v.findings if f.code == "GHOST_MEMORY")
    assert f.evidence["basis"] == "device" and "device totals stand in" in f.message
    assert "wsl --shutdown" in f.message and f.action is None


def test_no_ghost_for_a_context_overhead_or_a_one_cycle_blip(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    me = os.getpid()
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = _run_with_reserved(300 << 20, me)  # a small model: 300 MiB reserved, 500 MiB of context
    wd = Watchdog()
    write_scenario(
        path,
        {"devices": [_device(used_bytes=800 << 20)], "processes": [{"pid": me, "used_bytes": 800 << 20}]},
    )
    for _ in range(3):
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me])), b.now)
        assert all(f.code != "GHOST_MEMORY" for f in v.findings)
    b = _run_with_reserved(8 * GIB, me)  # 2 GiB over the allocator, but only 1.25x: not a ghost
    write_scenario(
        path, {"devices": [_device(used_bytes=10 * GIB)], "processes": [{"pid": me, "used_bytes": 10 * GIB}]}
    )
    for _ in range(3):
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me])), b.now)
        assert all(f.code != "GHOST_MEMORY" for f in v.findings)
    b = _run_with_reserved(4 * GIB, me)
    for used in (9 * GIB, 4 * GIB, 9 * GIB, 4 * GIB):
        write_scenario(
            path, {"devices": [_device(used_bytes=used)], "processes": [{"pid": me, "used_bytes": used}]}
        )
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me])), b.now)
        assert all(f.code != "GHOST_MEMORY" for f in v.findings)


def test_orphan_context_a_driver_pid_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    me, ghost = os.getpid(), _pid_that_cannot_exist()
    write_scenario(
        path,
        {
            "devices": [_device(used_bytes=12 * GIB, util_percent=100, power_w=60.0)],
            "processes": [{"pid": me, "used_bytes": 4 * GIB}, {"pid": ghost, "used_bytes": 8 * GIB}],
        },
    )
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = _run_with_reserved(4 * GIB, me)
    wd = Watchdog()
    v1 = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me])), b.now)
    assert all(f.code != "ORPHAN_CONTEXT" for f in v1.findings)
    v2 = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me])), b.now)
    [f] = [f for f in v2.findings if f.code == "ORPHAN_CONTEXT"]
    assert f.key == f"pid-{ghost}" and f.severity == "critical"
    assert f"compute pid {ghost} holding 8.0 GiB" in f.message and "100 %, 60.0 W" in f.message
    # Nothing of the run is left alive to kill: no key it cannot honour, the remedy in words.
    assert f.action is None and f.target is None and "nvidia-smi --gpu-reset -i 0" in f.message
    # A leftover of an earlier attempt alive (it may hold the context): the key kills exactly it.
    left = [Leftover(pid=4242, start_ticks=77, attempt=1, state="stopped")]
    v3 = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample(our_pids=[me]), leftovers=left), b.now)
    [f] = [f for f in v3.findings if f.code == "ORPHAN_CONTEXT"]
    assert f.action == "kill" and f.target is not None
    assert (f.target.pids, f.target.start_ticks) == ([4242], [77])
    assert f.target.label == "pid 4242, left from attempt 1" and f.target.label in f.message


def test_orphan_context_a_busy_device_with_nothing_of_ours(tmp_path: Path) -> None:
    # Scenario 10's wedge after a reboot: 100 % at 60 W, no process the driver will name.
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [_device(used_bytes=12 * GIB, util_percent=100, power_w=60.0)]})
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = RunBuilder()
    b.start()
    b.steps(10)
    b.end(exit_signal=9)
    wd = Watchdog()
    wd.evaluate(b.run, WatchContext(alive=False, gpu=probe.sample()), b.now)
    v = wd.evaluate(b.run, WatchContext(alive=False, gpu=probe.sample()), b.now)
    f = next(f for f in v.findings if f.code == "ORPHAN_CONTEXT")
    assert (
        f.key == "device-0" and "100 % busy at 60.0 W" in f.message and f.evidence["previous_pgids"] == [4242]
    )
    # The same busy device while our live trainer computes on it is just training.
    b2 = _run_with_reserved(4 * GIB, 4242)
    wd2 = Watchdog()
    for _ in range(3):
        v = wd2.evaluate(b2.run, WatchContext(alive=True, gpu=probe.sample()), b2.now)
    assert all(f.code != "ORPHAN_CONTEXT" for f in v.findings)


def test_the_demo_scenario_format_is_read(tmp_path: Path) -> None:
    # What core/demo/train.py's _drive_fake_nvml writes for ghost-memory.
    path = tmp_path / "gpu.json"
    pid = os.getpid()
    reserved = 4 << 30
    used = int(reserved * 2.1)
    write_scenario(
        path,
        {
            "devices": [
                {
                    "name": "NVIDIA GeForce RTX 3060 (fake)",
                    "total_bytes": 12 << 30,
                    "used_bytes": used,
                    "util_percent": 85,
                    "power_w": 160.0,
                }
            ],
            "processes": [{"pid": pid, "used_bytes": used}],
        },
    )
    s = GpuProbe(FakeNvml(path)).sample(our_pids=[pid])
    assert s.devices[0].used_bytes == used and s.processes[0].used_bytes == used
    assert s.devices[0].power_w == 160.0 and s.per_process is True


def test_a_busy_device_without_a_process_list_while_our_trainer_warms_up_is_not_an_orphan(
    tmp_path: Path,
) -> None:
    # Under WSL the process list is often empty; before the first step the allocator is unknown.
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [_device(util_percent=100)]})
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = RunBuilder()
    b.start()
    wd = Watchdog()
    for _ in range(3):
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=probe.sample()), b.now + 1)
    assert v.state == "starting" and v.findings == []


MIB = 1 << 20


def _ghost_after_two_cycles(path: Path, trainer: int, holder: int, reserved: int) -> Any:
    probe = GpuProbe(FakeNvml(path), clock=Clock())
    b = _run_with_reserved(reserved, trainer)
    wd = Watchdog()
    host = HostSample(t=0.0, available=True, wsl=False, effective_available_bytes=20 * GIB)
    for _ in range(2):
        gpu = probe.sample(our_pids=[trainer, holder])
        v = wd.evaluate(
            b.run, WatchContext(alive=True, attempt_pids=[trainer, holder], gpu=gpu, host=host), b.now
        )
    return next(f for f in v.findings if f.code == "GHOST_MEMORY")


def test_ghost_memory_names_the_pid_of_the_run_that_holds_it_without_an_allocator(tmp_path: Path) -> None:
    # gpu_check on the H200: the trainer (1.8 GiB on the driver, 1.07 GiB reserved: 1.68x, its
    # context's share) and a second process of its group holding 2 GiB + its own context.
    me = os.getpid()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "holder-role"])
    try:
        path = tmp_path / "gpu.json"
        rows = [{"pid": me, "used_bytes": 1843 * MIB}, {"pid": holder.pid, "used_bytes": 2788 * MIB}]
        used = 615 * MIB + 1843 * MIB + 2788 * MIB
        write_scenario(path, {"devices": [_device(name="NVIDIA H200", used_bytes=used)], "processes": rows})
        f = _ghost_after_two_cycles(path, me, holder.pid, 1097 * MIB)
        assert f"pid {holder.pid} (" in f.message and "holder-role" in f.message and "2.7 GiB" in f.message
        assert "reporting no allocator" in f.message and "DataLoader worker" in f.message
        assert "async-save child" in f.message and "not a rank" in f.message
        # The driver-side advice is for memory no pid explains; here every byte is explained.
        assert "gpu-reset" not in f.message and "nothing of ours holds it" not in f.message
        assert f.action == "kill" and f.target is not None and f.target.pids == [holder.pid]
        assert f.target.start_ticks == [procs_start_ticks(holder.pid)]
        held = f.evidence["holders"]
        assert held == [
            {"pid": holder.pid, "cmdline": held[0]["cmdline"], "used_bytes": 2788 * MIB, "rank": False}
        ]
        assert held[0]["cmdline"][-1] == "holder-role" and f.evidence["unexplained_bytes"] == 0
    finally:
        holder.kill()
        holder.wait()


def test_ghost_memory_no_pid_explains_keeps_the_driver_side_advice(tmp_path: Path) -> None:
    # Only the trainer is listed, with far more than its allocator reserves: nothing of the run
    # without an allocator explains it, so the advice is the driver's side, with no kill offered.
    me = os.getpid()
    path = tmp_path / "gpu.json"
    write_scenario(
        path, {"devices": [_device(used_bytes=9 * GIB)], "processes": [{"pid": me, "used_bytes": 9 * GIB}]}
    )
    f = _ghost_after_two_cycles(path, me, me, 4 * GIB)
    assert f.evidence["holders"] == [] and f.evidence["unexplained_bytes"] == 9 * GIB
    assert "gpu-reset" in f.message and f.action is None and "DataLoader" not in f.message


def test_ghost_memory_held_by_a_rank_offers_no_targeted_kill(tmp_path: Path) -> None:
    # The memory is the trainer's own process, listed under a rank that reports no allocator
    # (a reporter that sends none): named, but killing a rank is the trainer's kill, not a target.
    me = os.getpid()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        path = tmp_path / "gpu.json"
        rows = [{"pid": me, "used_bytes": 1843 * MIB}, {"pid": rank.pid, "used_bytes": 4 * GIB}]
        write_scenario(path, {"devices": [_device(used_bytes=6 * GIB)], "processes": rows})
        probe = GpuProbe(FakeNvml(path), clock=Clock())
        b = _run_with_reserved(1097 * MIB, me)
        b.rx(p.Hello(pid=rank.pid), rank=1)
        wd = Watchdog()
        for _ in range(2):
            gpu = probe.sample(our_pids=[me, rank.pid])
            v = wd.evaluate(b.run, WatchContext(alive=True, gpu=gpu), b.now)
        f = next(f for f in v.findings if f.code == "GHOST_MEMORY")
        assert f"pid {rank.pid} (" in f.message and "a rank)" in f.message
        assert f.target is None and f.evidence["holders"][0]["rank"] is True
    finally:
        rank.kill()
        rank.wait()
