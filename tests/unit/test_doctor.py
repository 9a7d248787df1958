"""`trainroom doctor`'s checks: against prepared /proc and /sys/fs/cgroup trees, injected statvfs
figures, the fake NVML at the pynvml boundary, the real pynvml's no-driver path on this machine,
real interpreters asked what their torch sees, and real `sudo` stand-ins on PATH."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from trainroom.core.configuration.config import Thresholds
from trainroom.core.configuration.settings import HostRoots
from trainroom.core.ops import host_checks as hc
from trainroom.core.ops.doctor import (
    DoctorOptions,
    GpuDevice,
    NvmlView,
    TorchView,
    check_cuda,
    check_nvml,
    gpu_need,
    nvml_view,
    render,
    run_doctor,
    torch_view,
)
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario

GIB = 1 << 30
NO_LIBRARY = str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
FAKE = "fake NVML ($TRAINROOM_FAKE_NVML): "


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


no_driver = pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")


def _proc(
    tmp_path: Path,
    *,
    avail: int = 20 * GIB,
    osrelease: str = "6.8.0-generic",
    scope: str | None = None,
    cap_eff: str = "0000000000000000",
) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "yama").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "cgroup").write_text("0::/job\n")
    (proc / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{cap_eff}\n")
    (proc / "sys" / "kernel" / "osrelease").write_text(osrelease + "\n")
    (proc / "version").write_text(f"Linux version {osrelease}\n")
    (proc / "sys" / "vm" / "drop_caches").write_text("")
    (proc / "meminfo").write_text(
        f"MemTotal: {32 * GIB // 1024} kB\nMemFree: {avail // 2048} kB\nMemAvailable: {avail // 1024} kB\n"
        f"Buffers: 1024 kB\nCached: {2 * GIB // 1024} kB\n"
    )
    if scope is not None:
        (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(scope + "\n")
    return proc


@pytest.fixture
def short(tmp_path: Path) -> Iterator[Path]:
    """A short directory: a state dir's socket paths must fit in 107 bytes, pytest's do not."""
    d = Path(tempfile.mkdtemp(prefix="trd", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _not_wsl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)


# --------------------------------------------------------------------------- NVML


@no_driver
def test_no_driver_reads_as_a_clean_degraded_nvml_shared_library_not_found() -> None:
    view = nvml_view(pynvml)
    assert view.available is False and view.reason == NO_LIBRARY == "NVML Shared Library Not Found"
    check = check_nvml(view, needed=False, wsl=False)
    assert (check.status, check.detail) == ("degraded", "NVML Shared Library Not Found")
    assert check.fix.startswith("nothing for a CPU run")
    # A run that uses a GPU cannot do without it.
    assert check_nvml(view, needed=True, wsl=False).status == "missing"


def test_fake_driver_version_devices_persistence_and_per_process_memory(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(
        path,
        {
            "driver_version": "560.94",
            "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 5 * GIB}],
            "processes": [{"pid": os.getpid(), "used_bytes": 5 * GIB}],
        },
    )
    view = nvml_view(FakeNvml(path))
    assert view.available and view.driver_version == "560.94" and view.per_process is True
    assert view.devices == [
        GpuDevice(
            index=0, name="NVIDIA H200", total_bytes=141 * GIB, used_bytes=5 * GIB, persistence_mode=True
        )
    ]
    check = check_nvml(view, needed=True, wsl=False)
    assert check.status == "ok", check
    assert check.detail.startswith(
        FAKE + "driver 560.94; #0 NVIDIA H200 141 GiB (5.0 GiB used), persistence on; "
        "per-process memory: reported (1 compute process(es) now); process call: v3; one probe cycle "
    )
    assert check.detail.endswith(f"one probe cycle {view.probe_cycle_ms} ms") and view.probe_cycle_ms > 0
    assert [(c.version, c.ok) for c in view.process_calls] == [("v3", True), ("v2", True), ("v1", True)]
    facts = {
        "available": True,
        "driver_version": "560.94",
        "devices": 1,
        "per_process": True,
        "process_api": "v3",
    }
    assert check.facts == facts | {"probe_cycle_ms": view.probe_cycle_ms, "fake": True}


def test_fake_wsl_like_driver_persistence_off_and_per_process_na_are_degraded(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(
        path,
        {
            "devices": [
                {"name": "NVIDIA GeForce RTX 3060", "total_bytes": 12 * GIB, "persistence_mode": 0},
                {"name": "NVIDIA GeForce RTX 3060", "errors": {"nvmlDeviceGetPersistenceMode": 3}},
            ],
            "processes": [{"pid": 4242, "used_bytes": None}],
        },
    )
    view = nvml_view(FakeNvml(path))
    assert [d.persistence_mode for d in view.devices] == [False, None]  # 3: NotSupported
    assert view.per_process is False
    check = check_nvml(view, needed=True, wsl=True)
    assert check.status == "degraded"
    assert "persistence off" in check.detail and "persistence n/a" in check.detail
    assert "N/A from this driver (WSL2/WDDM or MIG)" in check.detail
    assert "`sudo nvidia-smi -pm 1`" in check.fix and "WSL2/WDDM" in check.fix


def test_fake_driver_that_fails_init_or_shows_no_device(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(path, {"init_error": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    view = nvml_view(FakeNvml(path))
    assert view.reason == str(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert check_nvml(view, needed=False, wsl=True).fix.endswith(
        "install the NVIDIA Windows driver (WSL uses it; no Linux driver inside WSL) so `nvidia-smi` works "
        "(without it the VRAM panel has no driver view and GHOST_MEMORY / ORPHAN_CONTEXT cannot fire)"
    )
    write_scenario(path, {"driver_version": "550.1", "devices": []})
    empty = check_nvml(nvml_view(FakeNvml(path)), needed=True, wsl=False)
    assert (
        empty.status == "missing" and empty.detail == FAKE + "NVML works (driver 550.1) but shows no device"
    )


def test_whether_the_run_uses_a_gpu() -> None:
    one = NvmlView(
        available=True,
        devices=[GpuDevice(index=0, name="x", total_bytes=1, used_bytes=0, persistence_mode=None)],
    )
    none, cpu = NvmlView(available=False), TorchView(python="py", importable=True)
    cuda = TorchView(python="py", importable=True, cuda_available=True, device_count=2)
    assert gpu_need("auto", one, cpu) == (True, "the driver shows 1 device(s)")
    assert gpu_need("auto", none, cuda) == (True, "the trainer's torch sees 2 CUDA device(s)")
    assert gpu_need("auto", none, cpu) == (False, "neither the driver nor the trainer's torch sees a GPU")
    assert gpu_need("cpu", one, cuda)[0] is False and gpu_need("gpu", none, cpu)[0] is True


# --------------------------------------------------------------------------- torch in the trainer's interpreter


def test_torch_view_of_this_interpreter_is_what_torch_says_here() -> None:
    import torch

    view = torch_view(sys.executable)
    assert view.importable and view.version == str(torch.__version__)
    assert view.cuda_build == torch.version.cuda and view.cuda_available == torch.cuda.is_available()
    check = check_cuda(view, needed=False)
    if not view.cuda_available:
        assert check.status == "degraded" and check.fix.startswith("nothing for a CPU run")
        assert check_cuda(view, needed=True).status == "missing"


def test_torch_view_of_an_interpreter_without_torch_and_of_no_interpreter(tmp_path: Path) -> None:
    bare = tmp_path / "python-bare"  # this interpreter without site-packages: no torch there
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    view = torch_view(str(bare))
    assert not view.importable and view.error is not None and "torch" in view.error
    check = check_cuda(view, needed=False)
    assert check.status == "degraded" and f"torch is not importable by {bare}" in check.detail
    gone = torch_view(str(tmp_path / "nothing"))
    assert not gone.importable and gone.error is not None and gone.error.startswith("cannot run")


def test_a_cuda_build_that_sees_no_device_is_missing_for_a_gpu_run() -> None:
    view = TorchView(python="py", importable=True, version="2.5.1+cu124", cuda_build="12.4")
    check = check_cuda(view, needed=True)
    assert check.status == "missing" and check.detail == "torch 2.5.1+cu124 (CUDA 12.4) in py sees no device"
    ok = check_cuda(
        TorchView(
            python="py",
            importable=True,
            version="2.5.1",
            cuda_build="12.4",
            cuda_available=True,
            device_count=1,
            devices=["NVIDIA H200"],
        ),
        needed=True,
    )
    assert ok.status == "ok" and ok.detail.endswith("sees 1 device(s): NVIDIA H200")


# --------------------------------------------------------------------------- state dir, config


def test_state_dir_private_open_absent_and_too_long(short: Path, tmp_path: Path) -> None:
    state = short / "state"
    state.mkdir(mode=0o700)
    state.chmod(0o700)
    assert hc.check_state_dir(state).status == "ok"
    state.chmod(0o755)
    loose = hc.check_state_dir(state)
    assert loose.status == "degraded" and "mode 0755" in loose.detail and loose.fix.startswith("chmod 700")
    later = hc.check_state_dir(short / "later" / "trainroom")
    assert later.status == "ok" and f"the first launch creates it (0700) under {short}" in later.detail
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    long = hc.check_state_dir(deep)
    assert long.status == "missing" and long.needed
    assert isinstance(long.facts["socket_path_bytes"], int) and long.facts["socket_path_bytes"] > 107


def test_config_bad_key_is_missing_naming_it(tmp_path: Path) -> None:
    (tmp_path / "trainroom.toml").write_text("[thresholds]\nstal_floor_s = 3\n")
    check, config = hc.check_config(tmp_path, tmp_path / "state")
    assert check.status == "missing" and config is None
    assert "thresholds.stal_floor_s: unknown key" in check.detail
    (tmp_path / "trainroom.toml").write_text('lock_files = ["out/train.lock"]\n')
    check, config = hc.check_config(tmp_path, tmp_path / "state")
    assert check.status == "ok" and config is not None and check.facts["lock_files"] == 1


# --------------------------------------------------------------------------- host


def test_wsl_from_the_kernel_release(tmp_path: Path) -> None:
    assert hc.check_wsl(str(_proc(tmp_path / "a"))).status == "ok"
    wsl = hc.check_wsl(str(_proc(tmp_path / "b", osrelease="5.15.153.1-microsoft-standard-WSL2")))
    assert wsl.status == "degraded" and wsl.facts["wsl"] is True and "wsl --shutdown" in wsl.fix


def test_checkpoint_root_on_drvfs_is_degraded(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    root = tmp_path / "ckpt"
    mounts.write_text(f"/dev/sdc / ext4 rw 0 0\nC:\\134 {tmp_path} 9p rw,aname=drvfs;path=C:\\ 0 0\n")
    check = hc.check_ckpt_fs(root, str(mounts))
    assert check.status == "degraded" and check.facts["fstype"] == "9p"
    assert "torch.save there has written truncated checkpoints" in check.detail
    mounts.write_text("/dev/sdc / ext4 rw 0 0\n")
    ok = hc.check_ckpt_fs(root, str(mounts))
    assert ok.status == "ok" and ok.detail == f"{root} (created at the first save) on ext4 (mounted at /)"


def _statvfs(total: int, avail: int) -> Callable[[str], Any]:
    return lambda _p: SimpleNamespace(
        f_frsize=4096, f_bsize=4096, f_blocks=total // 4096, f_bfree=avail // 4096, f_bavail=avail // 4096
    )


@pytest.mark.parametrize(
    ("avail", "status"), [(500 * GIB, "ok"), (100 * GIB, "degraded"), (100 << 20, "missing")]
)
def test_disk_free_space_against_the_thresholds_and_the_save_reserve(
    tmp_path: Path, avail: int, status: str
) -> None:
    check = hc.check_disk(tmp_path, Thresholds(), _statvfs(1000 * GIB, avail))
    assert check.status == status, check
    assert check.facts["free_bytes"] == avail


@pytest.mark.parametrize(("avail", "status"), [(1 * GIB, "degraded"), (10 * GIB, "ok")])
def test_host_ram_against_the_enomem_threshold(tmp_path: Path, avail: int, status: str) -> None:
    proc = _proc(tmp_path, avail=avail)
    check = hc.check_host_ram(str(proc), str(tmp_path / "cgroup"), Thresholds())
    assert check.status == status and check.facts["available_bytes"] == avail


def _cgroup2(tmp_path: Path) -> tuple[Path, Path]:
    proc, cg = _proc(tmp_path), tmp_path / "cgroup"
    (cg / "job").mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("memory\n")
    (cg / "job" / "memory.reclaim").write_text("")
    (cg / "job" / "memory.stat").write_text("file 1048576\n")
    return proc, cg


def _deny_access(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """A control file this user may not write: a real mode without root; root ignores modes, so
    there the os.access boundary answers as the kernel would for a read-only mount."""
    if os.geteuid() != 0:
        path.chmod(stat.S_IRUSR)
        return
    real = os.access

    def access(p: Any, mode: int, *a: Any, **kw: Any) -> bool:
        if os.fspath(p) == str(path) and mode & os.W_OK:
            return False
        return real(p, mode, *a, **kw)

    monkeypatch.setattr(os, "access", access)


def test_reclaim_direct_through_sudo_or_by_hand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, cg = _cgroup2(tmp_path)
    target = cg / "job" / "memory.reclaim"
    direct = hc.check_reclaim(str(cg), str(proc), sudo=lambda _s: pytest.fail("sudo asked"))
    assert direct.status == "ok" and direct.facts == {
        "method": "cgroup2-memory.reclaim",
        "target": str(target),
        "page_cache_bytes": 2 * GIB + 1024 * 1024,
        "via": "direct",
    }
    _deny_access(monkeypatch, target)
    asked: list[str] = []
    via_sudo = hc.check_reclaim(str(cg), str(proc), sudo=lambda s: asked.append(s))
    assert via_sudo.status == "ok" and via_sudo.facts["via"] == "sudo" and "memory.reclaim" in asked[0]
    by_hand = hc.check_reclaim(str(cg), str(proc), sudo=lambda _s: "a password is required")
    assert by_hand.status == "degraded" and "sudo -n says: a password is required" in by_hand.detail
    assert by_hand.fix.startswith("sudo sh -c ") and str(target) in by_hand.fix


def _stub_sudo(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sudo").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_sudo_policy_is_asked_without_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "argv"
    _stub_sudo(tmp_path / "ok", monkeypatch, f"printf '%s\\n' \"$@\" > {log}; exit 0")
    assert hc.sudo_refusal("echo 1 > /x") is None
    assert log.read_text().splitlines() == ["-n", "-l", "sh", "-c", "echo 1 > /x"]
    _stub_sudo(tmp_path / "no", monkeypatch, 'echo "sudo: a password is required" >&2; exit 1')
    assert hc.sudo_refusal("true") == "sudo: a password is required"
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert hc.sudo_refusal("true") == "sudo is not installed"


@pytest.mark.parametrize(
    ("scope", "cap", "status", "said"),
    [
        (None, False, "ok", "same-user ptrace is allowed (no Yama)"),
        ("0", False, "ok", "ptrace_scope=0"),
        ("1", False, "degraded", "kernel.yama.ptrace_scope=1: only a descendant may ptrace"),
        ("1", True, "ok", "this process has CAP_SYS_PTRACE"),
        ("3", True, "degraded", "no process may ptrace another until reboot"),
    ],
)
def test_stack_dumps_py_spy_and_ptrace_rights(
    tmp_path: Path, scope: str | None, cap: bool, status: str, said: str
) -> None:
    proc = _proc(tmp_path, scope=scope, cap_eff=f"{(1 << 19) if cap else 0:016x}")
    check = hc.check_stacks(str(proc), py_spy="/opt/py-spy")
    assert check.status == status and said in check.detail


def test_stack_dumps_without_py_spy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainroom.core.ops import stacks

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)  # nor beside the interpreter
    check = hc.check_stacks(str(_proc(tmp_path)))
    assert check.status == "degraded" and check.facts["py_spy"] is None and "py-spy" in check.fix


def test_ssh_client() -> None:
    assert hc.check_ssh(lambda _n: None).status == "degraded"
    assert hc.check_ssh(lambda _n: "/usr/bin/ssh").detail == "ssh at /usr/bin/ssh"


# --------------------------------------------------------------------------- the report


def _options(tmp_path: Path, short: Path, gpu: str = "auto") -> DoctorOptions:
    state = short / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return DoctorOptions(
        project_dir=str(tmp_path),
        state_dir=str(state),
        python=sys.executable,
        gpu=gpu,  # type: ignore[arg-type]
        roots=HostRoots(proc=str(_proc(tmp_path / "host")), cgroup=str(tmp_path / "cgroup")),
    )


def test_report_with_a_gpu_the_cpu_torch_cannot_use_is_missing_cuda(tmp_path: Path, short: Path) -> None:
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB}]})
    report = run_doctor(_options(tmp_path, short), nvml=FakeNvml(path), sudo=lambda _s: "no sudo")
    names = [c.name for c in report.checks]
    assert names == [
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
    assert report.gpu_needed and report.gpu_needed_why == "the driver shows 1 device(s)"
    assert [c.name for c in report.missing] == ["cuda"] and not report.ok
    assert report.ckpt_root == str(short / "state" / "runs" / "<run>" / "checkpoints")
    told = run_doctor(_options(tmp_path, short, gpu="cpu"), nvml=FakeNvml(path), sudo=lambda _s: "no sudo")
    assert told.ok and not told.gpu_needed and told.as_dict()["checks"][3]["status"] == "degraded"


@no_driver
def test_report_on_this_machine_without_a_driver_is_ok_and_says_so(tmp_path: Path, short: Path) -> None:
    report = run_doctor(_options(tmp_path, short), nvml=pynvml, sudo=lambda _s: "no sudo")
    nvml = next(c for c in report.checks if c.name == "nvml")
    assert (nvml.status, nvml.detail) == ("degraded", "NVML Shared Library Not Found")
    lines = render(report)
    [line] = [line for line in lines if line.startswith("nvml ")]
    assert line.split(None, 1)[1] == "degraded: NVML Shared Library Not Found"
    assert lines[-1].startswith("nothing the run needs is missing (exit 0); degraded: nvml")


def test_render_names_what_is_missing(tmp_path: Path, short: Path) -> None:
    (tmp_path / "trainroom.toml").write_text("theme = 3\n")
    report = run_doctor(
        _options(tmp_path, short, gpu="cpu"), nvml=FakeNvml(tmp_path / "none.json"), sudo=lambda _s: None
    )
    lines = render(report)
    assert lines[-1] == "missing what the run needs: config (exit 1)"
    config = next(i for i, line in enumerate(lines) if line.startswith("config"))
    assert "theme: expected str | null, got int" in lines[config] and lines[config + 1].strip().startswith(
        "fix:"
    )


def test_errno_of_a_disk_that_cannot_be_read(tmp_path: Path) -> None:
    def broken(_p: str) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    check = hc.check_disk(tmp_path, Thresholds(), broken)
    assert check.status == "missing" and check.detail.endswith("Input/output error")
