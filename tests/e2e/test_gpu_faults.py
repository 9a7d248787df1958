"""The GPU's own faults, end to end: a real keeper and the real demo trainer on the CPU, the
driver's view from the fake NVML at the pynvml boundary (which places the trainer on a PCI bus),
and the kernel's word written to the real /dev/kmsg as root (an injected line's facility is
"user": the reader does not filter on it).

- An Xid 79 for the run's bus makes `status` say GPU_LOST with the device; an Xid for another
  bus, written first, is read (it is in the attempt's events) and is not this run's finding; the
  trainer's death then folds under GPU_LOST, and resume is refused onto that device.
- A thermal throttle with a drop in the step rate: GPU_THROTTLED, and SLOW names throttling.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run import store as runs
from trainroom.core.run.store import RunInfo
from trainroom.core.wire import protocol as p

START_S = 90.0
SEEN_S = 30.0  # generous on a loaded machine; the keeper probes once a second


def _kmsg_writable() -> str | None:
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        return f"/dev/kmsg is not writable here ({exc.strerror}): the kernel's lines cannot be injected"
    os.close(fd)
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return f"/dev/kmsg is not readable here ({exc.strerror})"
    return None


def _kmsg(line: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _notes(info: RunInfo) -> list[str]:
    recs = read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
    return [r.message for r in recs if isinstance(r, p.KeeperNote)]


def _with(info: Any, code: str) -> dict[str, Any] | None:
    d = status(info)
    return d if _finding(d, code) else None


def _buses() -> tuple[int, int, int]:
    """A domain and bus no other test (of any engineer on this host) writes: the log is shared."""
    rnd = random.Random(f"{os.getpid()}-{time.time_ns()}")
    dom = rnd.randrange(0x1000, 0xFFFF)
    return dom, rnd.randrange(0x10, 0xF0), dom ^ rnd.randrange(0x1, 0xFFF)  # another domain


@pytest.mark.skipif(_kmsg_writable() is not None, reason=str(_kmsg_writable()))
def test_an_xid_79_for_the_runs_bus_is_gpu_lost_and_another_bus_is_not_this_runs(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dom, bus, other = _buses()
    gpu = tmp_path / "gpu.json"
    nvml_bus = f"{dom:08X}:{bus:02X}:00.0"  # as nvmlDeviceGetPciInfo(h).busId spells it
    # A healthy H100's figures (the trainer keeps what it does not drive): they raise nothing.
    healthy = {
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": nvml_bus,
        "ecc": {"volatile": [0, 0], "aggregate": [2, 0]},
        "remapped_rows": [0, 0, 0, 0],
        "clock_reasons": 0x4,  # at its default power cap under load: by design
        "temp_c": 61,
        "temp_slowdown_c": 87,
        "temp_shutdown_c": 92,
        "power_limit_w": 700.0,
        "power_default_limit_w": 700.0,
        "pcie": [5, 5, 16, 16],
    }
    write_scenario(gpu, {"devices": [healthy]})
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    info = start_demo(step_delay=0.05, auto_resume=1, extra={"auto_resume_delay_s": 0.5})
    ours = f"{dom:04x}:{bus:02x}:00.0"

    def placed() -> dict[str, Any] | None:
        d = status(info)
        devs = d["gpu"]["devices"]
        on_bus = devs and devs[0].get("pci_bus_id") == ours
        return d if on_bus and d["vram"]["driver_run_bytes"] and d["gpu"]["kernel_log"] else None

    d = wait_for(placed, timeout=START_S, what="the trainer's rows on its bus in the driver view")
    assert d["gpu"]["kernel_log"].startswith("/dev/kmsg")
    assert d["gpu"]["devices"][0]["health"]["pcie_width_max"] == 16  # the rules read these figures
    step = d["step"] or 0
    d = wait_for(lambda: (s := status(info))["step"] >= step + 20 and s, timeout=START_S, what="steps")
    assert [f["code"] for f in d["findings"] if f["code"].startswith("GPU_")] == []
    _kmsg(f"NVRM: Xid (PCI:{other:04x}:{bus:02x}:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    _kmsg(f"NVRM: Xid (PCI:{dom:04x}:{bus:02x}:00): 79, pid=2, name=python, GPU has fallen off the bus.")
    t0 = time.monotonic()
    d = wait_for(lambda: _with(info, "GPU_LOST"), timeout=SEEN_S, what="GPU_LOST in status")
    print(f"GPU_LOST in status {time.monotonic() - t0:.2f} s after the kernel line")
    lost = _finding(d, "GPU_LOST")
    assert lost is not None
    assert (
        f"GPU 0 ({ours}, NVIDIA H100 80GB HBM3) fell off the bus (Xid 79, read from /dev/kmsg)"
        in lost["message"]
    )
    assert lost["evidence"]["device"] == 0 and lost["evidence"]["bus_id"] == ours
    # The other bus's line was read (it came first) and is not this run's finding.
    events = d["gpu"]["events"]
    theirs = [e for e in events if e.get("bus_id") == f"{other:04x}:{bus:02x}:00.0"]
    assert theirs and not theirs[0].get("ours") and theirs[0].get("device") is None
    assert [f for f in d["findings"] if f["code"].startswith("GPU_")] == [lost]
    # The trainer dies on the lost GPU: its death folds under GPU_LOST, and resume is refused.
    os.kill(d["pid"], signal.SIGKILL)
    d = wait_for(lambda: _with(info, "DEAD"), timeout=SEEN_S, what="DEAD")
    row = next(r for r in d["finding_rows"] if r["code"] == "GPU_LOST")
    assert [k["code"] for k in row["consequences"]] == ["DEAD"]
    assert not any(r["code"] == "DEAD" for r in d["finding_rows"])
    # Auto-resume does not start again on the lost GPU either, and says why.
    stopped = wait_for(
        lambda: next((n for n in _notes(info) if n.startswith("auto-resume stopped")), None),
        timeout=SEEN_S,
        what="auto-resume's verdict",
    )
    assert f"GPU 0 ({ours}) is lost (GPU_LOST)" in stopped, stopped
    assert any(n.startswith("GPU Xids: kernel log /dev/kmsg") for n in _notes(info))
    r = run_cli("resume", info.run_id, "--yes", timeout=120)
    said = r.stdout + r.stderr
    assert r.returncode != 0, said
    assert f"GPU 0 ({ours}) is lost (GPU_LOST)" in said, said
    assert "no healthy GPU on this host" in said, said


def test_a_thermal_throttle_with_a_rate_drop_is_named_as_slows_cause(trhome: Path) -> None:
    # The demo's gpu-throttle fault: from step 40 its (fake) GPU reports thermal slowdown at
    # 91 °C and its steps take 8x longer, as a GPU at its slowdown temperature does.
    info = start_demo(fault="gpu-throttle", fault_step=40, step_delay=0.1)
    d = wait_for(lambda: _with(info, "SLOW"), timeout=START_S, what="SLOW")
    hot = _finding(d, "GPU_THROTTLED")
    assert hot is not None, d["findings"]
    assert (
        "thermal slowdown (software), thermal slowdown (hardware) at 91 °C (slowdown at 87 °C)"
        in (hot["message"])
    )
    slow = _finding(d, "SLOW")
    assert slow is not None and slow["evidence"]["cause"] == "GPU throttled"
    assert "the GPU is throttled (GPU 0 thermal slowdown" in slow["message"]
    row = next(r for r in d["finding_rows"] if r["code"] == "GPU_THROTTLED")
    assert [k["code"] for k in row["consequences"]] == ["SLOW"]
