"""The GPU's own faults without a GPU: the kernel's Xid lines parsed, bus ids spelt one way, the
fake NVML's health functions (NotSupported a normal answer), the rules over a probe's sample,
NVML's critical-Xid events and a kernel log read through GpuEventWatch, and the folds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for
from trainroom.core.findings import Finding
from trainroom.core.health.context import WatchContext
from trainroom.core.health.gpufaults import ecc_findings, gpu_event_findings, link_findings, throttle_findings
from trainroom.core.ops.gpu_checks import check_gpu_health
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.probes.gpuevents import GpuEventWatch
from trainroom.core.probes.xid import norm_bus, parse_kernel_line
from trainroom.core.run.causes import fold

H100: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "total_bytes": 80 << 30,
    "used_bytes": 20 << 30,
    "util_percent": 97,
    "power_w": 690.0,
    "pci_bus_id": "00000000:3B:00.0",
    "ecc": {"volatile": [0, 0], "aggregate": [3, 0]},
    "remapped_rows": [0, 0, 0, 0],
    "clock_reasons": 0x4 | 0x1,  # at its (default) power cap: by design, not a finding
    "temp_c": 64,
    "temp_slowdown_c": 87,
    "temp_shutdown_c": 92,
    "power_limit_w": 700.0,
    "power_default_limit_w": 700.0,
    "pcie": [5, 5, 16, 16],
}


def _sample(tmp_path: Path, **dev: Any) -> WatchContext:
    path = tmp_path / "gpu.json"
    write_scenario(
        path,
        {"devices": [{**H100, **dev}], "processes": [{"pid": os.getpid(), "used_bytes": 19 << 30}]},
    )
    gpu = GpuProbe(FakeNvml(path)).sample(our_pids=[os.getpid()])
    return WatchContext(gpu=gpu)


def _all(ctx: WatchContext) -> list[Finding]:
    return [*gpu_event_findings(ctx), *ecc_findings(ctx), *throttle_findings(ctx), *link_findings(ctx)]


def test_kernel_lines_parse_and_bus_ids_are_spelt_one_way() -> None:
    x = parse_kernel_line(
        "4,900,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python, GPU has fallen off the bus."
    )
    assert x is not None and (x.bus_id, x.xid, x.lost) == ("0000:3b:00.0", 79, True)
    x = parse_kernel_line("[  42.1] host kernel: NVRM: Xid (0000:5e:00): 13, Graphics Exception")
    assert x is not None and (x.bus_id, x.xid, x.lost) == ("0000:5e:00.0", 13, False)
    x = parse_kernel_line("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")
    assert x is not None and (x.bus_id, x.xid, x.lost) == ("0000:3b:00.0", None, True)
    assert parse_kernel_line("usb 1-1: new device") is None
    assert parse_kernel_line("NVRM: " + "Xid (" * 20000) is None  # bounded, linear
    assert norm_bus(b"00000000:3B:00.0") == norm_bus("0000:3b:00") == norm_bus("PCI:0000:3B:00.0")
    assert norm_bus("not:a:bus") is None and norm_bus("3b") is None


def test_a_healthy_h100_raises_nothing_and_not_supported_is_a_normal_answer(tmp_path: Path) -> None:
    ctx = _sample(tmp_path)
    assert ctx.gpu is not None and ctx.gpu.notes == []
    h = ctx.gpu.devices[0].health
    assert h is not None and h.ecc_aggregate_sbe == 3 and h.retired_pending is None  # H100: rows, not pages
    assert _all(ctx) == []
    # A GeForce: no ECC, no remapping, no thermal limits: every one of them NotSupported.
    bare = dict.fromkeys(
        ("ecc", "remapped_rows", "temp_slowdown_c", "temp_shutdown_c", "power_default_limit_w")
    )
    ctx = _sample(tmp_path, **bare)
    assert ctx.gpu is not None and ctx.gpu.notes == [] and _all(ctx) == []


def test_a_double_bit_count_raises_gpu_ecc_and_a_pending_remap_says_reset(tmp_path: Path) -> None:
    ctx = _sample(tmp_path, ecc={"volatile": [5, 2], "aggregate": [9, 2]}, remapped_rows=[0, 1, 1, 0])
    [f] = _all(ctx)
    assert f.code == "GPU_ECC" and f.severity == "critical"
    assert f.message == (
        "GPU 0 (0000:3b:00.0, NVIDIA H100 80GB HBM3): 2 uncorrectable (double-bit) ECC errors since the "
        "driver loaded; a row remap waits for a GPU reset: reset the GPU before resuming on it"
    )
    assert f.evidence["ecc_volatile_dbe"] == 2 and f.evidence["remap_pending"] is True


def test_throttling_counts_when_thermal_or_a_lowered_cap_and_a_link_when_narrow(tmp_path: Path) -> None:
    [f] = _all(_sample(tmp_path, clock_reasons=0x40, temp_c=91))
    assert f.code == "GPU_THROTTLED"
    assert "thermal slowdown (hardware) at 91 °C (slowdown at 87 °C), 690 W of a 700 W limit" in f.message
    [f] = _all(_sample(tmp_path, clock_reasons=0x4, power_limit_w=300.0, power_w=299.0))
    assert "power cap at 64 °C (slowdown at 87 °C), 299 W of a 300 W limit, default 700 W" in f.message
    # The older binding's name answers where the newer one is missing.
    [f] = _all(_sample(tmp_path, clock_reasons=0x20, errors={"nvmlDeviceGetCurrentClocksEventReasons": 13}))
    assert f.code == "GPU_THROTTLED" and f.evidence["clock_reasons"] == 0x20
    [f] = _all(_sample(tmp_path, pcie=[5, 5, 8, 16]))
    assert f.code == "GPU_LINK_DEGRADED" and "x8 of x16" in f.message
    assert (
        _all(_sample(tmp_path, pcie=[1, 5, 16, 16], util_percent=0)) == []
    )  # idle: trained down to save power


def _watch_sample(watch: GpuEventWatch, nv: FakeNvml) -> Any:
    return watch.take(GpuProbe(nv).sample(our_pids=[os.getpid()]), attempt=1)


def test_nvml_xid_events_and_kernel_lines_resolve_to_the_runs_device(tmp_path: Path) -> None:
    path, log = tmp_path / "gpu.json", tmp_path / "kmsg"
    log.write_text("6,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, old line before the keeper started\n")
    scenario = {
        "devices": [H100, {**H100, "pci_bus_id": "00000000:5E:00.0"}],
        "processes": [{"pid": os.getpid(), "used_bytes": 1 << 30, "device": 0}],
    }
    write_scenario(path, scenario)
    nv = FakeNvml(path)
    watch = GpuEventWatch(nv, kmsg=str(log), journalctl=None)
    try:
        s = _watch_sample(watch, nv)
        assert s.kernel_log.startswith(str(log)) and s.events == []  # read from its end
        wait_for(lambda: "nvml events on 2 device(s)" in watch.source, timeout=10)
        write_scenario(path, {**scenario, "events": [{"device": 1, "xid": 13}, {"device": 0, "xid": 48}]})
        with open(log, "a") as f:
            f.write("12,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
        s = wait_for(lambda: len((x := _watch_sample(watch, nv)).events) >= 3 and x, timeout=10)
        by = {(e.device, e.xid): e for e in s.events}
        assert by[(1, 13)].ours is False and by[(0, 48)].ours is True and by[(0, 79)].lost
        fs = gpu_event_findings(WatchContext(gpu=s))
        assert sorted(f.code for f in fs) == ["GPU_LOST", "GPU_XID"]  # device 1's Xid 13 is not ours
        xid = next(f for f in fs if f.code == "GPU_XID")
        assert "Xid 48 on GPU 0 (0000:3b:00.0, NVIDIA H100 80GB HBM3): double-bit ECC error" in xid.message
        assert xid.message.endswith("(read from nvml events): reset the GPU")
    finally:
        watch.close()


def test_without_a_kernel_log_the_watch_says_why() -> None:
    watch = GpuEventWatch(None, kmsg="/nonexistent/kmsg", journalctl=None)
    try:
        assert watch.start().startswith("unavailable: /nonexistent/kmsg: No such file or directory")
    finally:
        watch.close()


def _f(code: Any, t: float, **ev: Any) -> Finding:
    return Finding(code=code, severity="critical", message=code, first_seen=t, last_seen=t, evidence=ev)


@pytest.mark.parametrize("consequence", ["DEAD", "HUNG"])
def test_a_death_or_hang_folds_under_a_lost_gpu(consequence: str) -> None:
    t = time.time()
    rows = fold([_f(consequence, t), _f("GPU_LOST", t + 0.5, device=0)])  # the line read just after
    assert [r.cause.code for r in rows] == ["GPU_LOST"]
    assert [k.code for k in rows[0].consequences] == [consequence]


def test_doctor_judges_every_device_of_the_host_and_the_xids_left_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(
        "4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
        "4,2,2,-;NVRM: Xid (PCI:0000:99:00): 13, another host's bus in a shared test log\n"
    )
    ok = check_gpu_health(_sample(tmp_path).gpu, kmsg=str(tmp_path / "none"))
    assert ok.status == "ok" and "no ECC error pending, no throttling" in ok.detail
    assert "a keeper reads Xids from" in ok.detail
    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [{**H100, "ecc": {"volatile": [0, 1], "aggregate": [0, 1]}}]})
    bad = check_gpu_health(GpuProbe(FakeNvml(path)).sample(), kmsg=str(log))  # no process: every device
    assert bad.status == "degraded"
    assert "1 uncorrectable (double-bit) ECC errors" in bad.detail
    assert "0000:3b:00.0 fell off the bus (still in the kernel's log): drain the node" in bad.detail
    assert "0000:99:00" not in bad.detail


def test_bench_says_when_throttling_explains_a_low_figure(tmp_path: Path) -> None:
    from trainroom.core.ops.bench import BenchResult, explain, verdict

    word, text = verdict(40.0, "Hopper/Blackwell data-centre GPU", 100.0)
    low = BenchResult(ok=True, device="cuda:0", tflops=40.0, verdict=word, message=text)
    hot = _sample(tmp_path, clock_reasons=0x4, power_limit_w=200.0, power_w=199.0).gpu
    said = explain(low, hot)
    assert (
        said.throttled
        == "GPU 0 power cap at 64 °C (slowdown at 87 °C), 199 W of a 200 W limit, default 700 W"
    )
    assert said.message == (
        "below the 100 TFLOPS floor of its class (Hopper/Blackwell data-centre GPU): throttling explains it "
        f"({said.throttled})"
    )
    assert explain(low, _sample(tmp_path).gpu) == low  # at its default cap: not the explanation


def test_export_gauges_carry_dcgm_labels_and_pass_promtool(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from trainroom.core.cli.export import _Families
    from trainroom.core.cli.export_gpu import gpu_metrics
    from trainroom.core.run.status import gpu_status

    ctx = _sample(tmp_path, clock_reasons=0x40, ecc={"volatile": [1, 2], "aggregate": [3, 4]}, temp_c=90)
    f = _Families()
    gpu_metrics(f.put, {"run": "r1"}, gpu_status(ctx.gpu))

    class _C:
        def collect(self) -> Any:
            return iter(f.all.values())

    reg = CollectorRegistry()
    reg.register(_C())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    got = {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k in ("type", "counter", "reason"))),
        ): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("gpu") == "0" and s.labels.get("pci_bus_id") == "00000000:3B:00.0"
    }
    assert got[("trainroom_gpu_temperature_celsius", ())] == 90
    assert got[("trainroom_gpu_ecc_errors", (("counter", "volatile"), ("type", "dbe")))] == 2
    assert got[("trainroom_gpu_ecc_errors", (("counter", "aggregate"), ("type", "sbe")))] == 3
    assert got[("trainroom_gpu_clock_event_active", (("reason", "hw_thermal_slowdown"),))] == 1
    assert got[("trainroom_gpu_clock_event_active", (("reason", "sw_power_cap"),))] == 0
    assert got[("trainroom_gpu_pcie_link_width", ())] == 16 and got[("trainroom_gpu_lost", ())] == 0
    assert 'model_name="NVIDIA H100 80GB HBM3"' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: prometheus); the figures above were checked")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_gpu_check_reads_health_without_a_false_finding_and_fails_a_sick_device(tmp_path: Path) -> None:
    import sys

    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import gpu_check_health as gch

    path = tmp_path / "gpu.json"
    write_scenario(path, {"devices": [H100]})
    healthy = gch.check_gpu_health(FakeNvml(path), 0)
    assert healthy["result"] == "pass" and healthy["figures"]["pcie"] == "gen5/5 x16/16"
    assert gch.check_xid_events(FakeNvml(path), 0)["result"] == "pass"
    write_scenario(path, {"devices": [{**H100, "remapped_rows": [0, 0, 0, 1], "events_supported": False}]})
    sick = gch.check_gpu_health(FakeNvml(path), 0)
    assert sick["result"] == "fail" and "GPU_ECC" in sick["detail"] and "a row remap failed" in sick["detail"]
    assert gch.check_xid_events(FakeNvml(path), 0)["result"] == "skip"


def test_where_kmsg_cannot_be_read_the_journal_is_followed_and_an_overlong_line_skipped() -> None:
    long = "x" * 5000  # past the line bound: its tail must not be read as a line of its own
    script = (
        f"echo '{long}NVRM: Xid (PCI:0000:aa:00): 13, hidden in an over-long line'; "
        "echo '[ 5.1] host kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=9, GPU has fallen off the bus.'; "
        "exec sleep 30"
    )
    watch = GpuEventWatch(None, kmsg="/nonexistent/kmsg", journalctl=("sh", "-c", script))
    try:
        assert watch.start() == "journalctl -k"
        ev = wait_for(lambda: watch.feed.q.get(timeout=0.1) if not watch.feed.q.empty() else None, timeout=10)
        assert (ev.bus_id, ev.xid, ev.lost, ev.source) == ("0000:3b:00.0", 79, True, "journalctl -k")
        time.sleep(0.3)
        assert watch.feed.q.empty()
    finally:
        watch.close()


def test_nvmls_gpu_is_lost_on_the_runs_device_is_gpu_lost_without_a_kernel_line(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    procs = [{"pid": os.getpid(), "used_bytes": 1 << 30, "device": 1}]
    scenario = {"devices": [H100, {**H100, "pci_bus_id": "00000000:5E:00.0"}], "processes": procs}
    write_scenario(path, scenario)
    nv = FakeNvml(path)
    watch = GpuEventWatch(nv, kmsg=str(tmp_path / "none"), journalctl=None)
    try:
        assert _watch_sample(watch, nv).events == []
        write_scenario(path, {**scenario, "devices": [H100, {**H100, "lost": True}]})
        s = _watch_sample(watch, nv)
        assert s.devices[1].lost and not s.devices[0].lost
        [f] = gpu_event_findings(WatchContext(gpu=s))
        assert f.code == "GPU_LOST" and f.evidence["device"] == 1 and f.evidence["bus_id"] == "0000:5e:00.0"
        assert f.message.startswith("GPU 1 (0000:5e:00.0) fell off the bus (the driver, read from nvml)")
        # NVML will not even count the devices now: still the run's one device, said once.
        write_scenario(path, {**scenario, "errors": {"nvmlDeviceGetCount": 15}})
        s = _watch_sample(watch, nv)
        assert not s.available and [e.device for e in s.events] == [1]
    finally:
        watch.close()


def test_an_applications_xid_names_its_process_and_another_ones_is_not_this_runs(tmp_path: Path) -> None:
    from trainroom.core.probes.gpu import pid_namespace

    if pid_namespace() != "host":
        pytest.skip("the kernel's pids are not this namespace's: the filter is off here, by design")
    path, log = tmp_path / "gpu.json", tmp_path / "kmsg"
    log.write_text("")
    write_scenario(path, {"devices": [H100], "processes": [{"pid": os.getpid(), "used_bytes": 1 << 30}]})
    nv = FakeNvml(path)
    watch = GpuEventWatch(nv, kmsg=str(log), journalctl=None)
    try:
        _watch_sample(watch, nv)
        with open(log, "a") as f:
            f.write("4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=999999, name=other, Graphics Exception\n")
            f.write(f"4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 31, pid={os.getpid()}, name=python, MMU Fault\n")
            f.write("4,3,3,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=999999, name=other, DBE\n")
        s = wait_for(lambda: len((x := _watch_sample(watch, nv)).events) == 3 and x, timeout=10)
        ours = {e.xid: e.ours for e in s.events}
        assert ours == {13: False, 31: True, 48: True}  # a double-bit error is the device's, whoever hit it
        assert sorted(f.key for f in gpu_event_findings(WatchContext(gpu=s))) == [
            "0000:3b:00.0:31",
            "0000:3b:00.0:48",
        ]
    finally:
        watch.close()
