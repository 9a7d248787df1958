"""probes.host: /proc/meminfo and the cgroup (v1, v2, namespaced) on prepared trees, and the real
machine's own figures."""

from __future__ import annotations

from pathlib import Path

from tests.support.run_builder import RunBuilder
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.probes.host import HostProbe, cgroup_memory, is_wsl, read_meminfo

GIB = 1 << 30
KIB = 1024


def _meminfo(total: int, avail: int, cached: int, buffers: int) -> str:
    return (
        f"MemTotal:       {total // KIB} kB\nMemFree:        {avail // 2 // KIB} kB\n"
        f"MemAvailable:   {avail // KIB} kB\nBuffers:        {buffers // KIB} kB\n"
        f"Cached:         {cached // KIB} kB\nSwapTotal:      0 kB\nSwapFree:       0 kB\n"
        "HugePages_Total:       0\n"
    )


def _tree(tmp_path: Path, cgroup_line: str, meminfo: str) -> tuple[Path, Path]:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "meminfo").write_text(meminfo)
    (proc / "sys" / "kernel" / "osrelease").write_text("6.8.0-generic\n")
    cg.mkdir()
    return proc, cg


def test_meminfo_figures_and_page_cache(tmp_path: Path) -> None:
    proc, cg = _tree(tmp_path, "0::/", _meminfo(32 * GIB, 10 * GIB, 6 * GIB, GIB // 2))
    s = HostProbe(proc_root=str(proc), cgroup_root=str(cg), clock=lambda: 5.0).sample()
    assert s.available and s.t == 5.0
    assert s.mem_total_bytes == 32 * GIB and s.mem_available_bytes == 10 * GIB
    assert s.page_cache_bytes == 6 * GIB + GIB // 2  # Cached + Buffers
    assert s.cgroup is None and s.effective_available_bytes == 10 * GIB and s.wsl is False
    assert read_meminfo(str(proc / "meminfo"))["HugePages_Total"] == 0  # no unit: not scaled


def test_cgroup_v2_limit_usage_and_reclaim_file(tmp_path: Path) -> None:
    proc, cg = _tree(tmp_path, "0::/user.slice/train.scope", _meminfo(32 * GIB, 20 * GIB, 8 * GIB, 0))
    (cg / "cgroup.controllers").write_text("cpu memory\n")
    d = cg / "user.slice" / "train.scope"
    d.mkdir(parents=True)
    (d / "memory.max").write_text(f"{4 * GIB}\n")
    (d / "memory.current").write_text(f"{int(3.5 * GIB)}\n")
    (d / "memory.stat").write_text(f"anon {3 * GIB}\nfile {GIB // 2}\ninactive_file {GIB // 4}\n")
    (d / "memory.reclaim").write_text("")
    s = HostProbe(proc_root=str(proc), cgroup_root=str(cg)).sample()
    c = s.cgroup
    assert c.version == 2 and c.path == "/user.slice/train.scope"
    assert c.limit_bytes == 4 * GIB and c.usage_bytes == int(3.5 * GIB) and c.file_bytes == GIB // 2
    assert c.available_bytes == GIB // 2 + GIB // 4
    assert c.reclaim_file == str(d / "memory.reclaim")
    # The cgroup is what runs out first: the effective figure is its own.
    assert s.effective_available_bytes == GIB // 2 + GIB // 4
    b = RunBuilder()
    b.start()
    f = next(
        f
        for f in Watchdog().evaluate(b.run, WatchContext(alive=True, host=s), b.now).findings
        if f.code == "HOST_RAM_LOW"
    )
    assert f.message.startswith("cgroup (limit 4.0 GiB) RAM low: 768 MiB available")


def test_cgroup_v2_unlimited_and_namespaced_root(tmp_path: Path) -> None:
    # Inside a cgroup namespace /proc/self/cgroup says "/" and the files sit at the root.
    proc, cg = _tree(tmp_path, "0::/", _meminfo(16 * GIB, 8 * GIB, GIB, 0))
    (cg / "cgroup.controllers").write_text("memory\n")
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text(f"{2 * GIB}\n")
    c = cgroup_memory(str(proc), str(cg), 16 * GIB)
    assert c is not None and c.limit_bytes is None and c.available_bytes is None and c.usage_bytes == 2 * GIB


def test_cgroup_v1_memory_controller(tmp_path: Path) -> None:
    proc, cg = _tree(
        tmp_path, "9:pids:/\n4:memory:/process_api/abc\n0::/", _meminfo(24 * GIB, 20 * GIB, GIB, 0)
    )
    d = cg / "memory" / "process_api" / "abc"
    d.mkdir(parents=True)
    (d / "memory.limit_in_bytes").write_text(f"{8 * GIB}\n")
    (d / "memory.usage_in_bytes").write_text(f"{6 * GIB}\n")
    (d / "memory.stat").write_text(f"cache {GIB}\ntotal_cache {GIB}\ntotal_inactive_file {GIB // 2}\n")
    c = cgroup_memory(str(proc), str(cg), 24 * GIB)
    assert c is not None and c.version == 1 and c.limit_bytes == 8 * GIB
    assert c.available_bytes == 2 * GIB + GIB // 2 and c.file_bytes == GIB and c.reclaim_file is None
    # v1's "no limit" is a page-rounded LONG_MAX.
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    c = cgroup_memory(str(proc), str(cg), 24 * GIB)
    assert c is not None and c.limit_bytes is None and c.available_bytes is None


def test_wsl_is_detected_from_the_kernel_release(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)
    proc, _ = _tree(tmp_path, "0::/", _meminfo(GIB, GIB, 0, 0))
    assert is_wsl(str(proc)) is False
    (proc / "sys" / "kernel" / "osrelease").write_text("5.15.153.1-microsoft-standard-WSL2\n")
    assert is_wsl(str(proc)) is True


def test_missing_meminfo_is_unavailable_not_an_exception(tmp_path: Path) -> None:
    s = HostProbe(proc_root=str(tmp_path / "nowhere")).sample()
    assert s.available is False and s.reason.startswith("host memory view unavailable")
    b = RunBuilder()
    b.start()
    assert Watchdog().evaluate(b.run, WatchContext(alive=True, host=s), b.now).findings == []


def test_this_machine() -> None:
    s = HostProbe().sample()
    assert s.available is True
    assert 0 < s.mem_available_bytes <= s.mem_total_bytes
    assert 0 < s.effective_available_bytes <= s.mem_available_bytes
    assert s.page_cache_bytes >= 0
    if s.cgroup is not None:
        assert s.cgroup.version in (1, 2) and s.cgroup.usage_bytes is not None
