"""Page-cache reclaim against a temporary tree that mimics /sys/fs/cgroup and /proc: the method
chosen, the value written, a denied write with and without a working sudo, WSL, and (opt-in) a
real drop on this machine."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from trainroom.core.ops.reclaim import detect_wsl, execute_reclaim, memory_figures, plan_reclaim

MEMINFO = """MemTotal:       32768000 kB
MemFree:         1000000 kB
MemAvailable:    2500000 kB
Buffers:          100000 kB
Cached:          6000000 kB
SwapCached:            0 kB
"""


class Host:
    """A fake host tree: <root>/proc and <root>/sys/fs/cgroup."""

    def __init__(self, root: Path, cgroup_lines: str, version: str = "Linux version 6.8.0 (gcc)") -> None:
        self.proc = root / "proc"
        self.sys = root / "sys" / "fs" / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "sys" / "vm").mkdir(parents=True)
        self.sys.mkdir(parents=True)
        (self.proc / "self" / "cgroup").write_text(cgroup_lines)
        (self.proc / "meminfo").write_text(MEMINFO)
        (self.proc / "version").write_text(version)
        self.drop_caches = self.proc / "sys" / "vm" / "drop_caches"
        self.drop_caches.write_text("")

    def cgroup_dir(self, *parts: str) -> Path:
        d = self.sys.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def plan(self, **kw):
        return plan_reclaim(self.sys, self.proc, env={}, **kw)

    def execute(self, **kw):
        return execute_reclaim(sys_root=self.sys, proc_root=self.proc, env={}, **kw)


@pytest.fixture
def deny(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make writes to one file fail as a denied write does. Without root, a read-only mode does
    it for real; root ignores modes, so there it is EACCES raised at the os.open boundary."""

    def make_unwritable(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
            return
        real_open = os.open

        def guarded_open(p, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
            if os.fspath(p) == str(path) and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(errno.EACCES, "Permission denied", str(p))
            return real_open(p, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", guarded_open)

    return make_unwritable


def stub_sudo(bin_dir: Path, monkeypatch: pytest.MonkeyPatch, *, works: bool) -> None:
    """A `sudo` first on PATH: one that runs its command (as a passwordless sudo would), or one
    that answers like sudo -n without credentials."""
    bin_dir.mkdir(exist_ok=True)
    sudo = bin_dir / "sudo"
    if works:
        sudo.write_text('#!/bin/sh\n[ "$1" = "-n" ] && shift\nexec "$@"\n')
    else:
        sudo.write_text('#!/bin/sh\necho "sudo: a password is required" >&2\nexit 1\n')
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_cgroup_v2_memory_reclaim_asks_for_the_cgroups_page_cache(tmp_path: Path) -> None:
    host = Host(tmp_path, "0::/user.slice/trainer.scope\n")
    (host.sys / "cgroup.controllers").write_text("cpu memory io\n")
    cg = host.cgroup_dir("user.slice", "trainer.scope")
    (cg / "memory.reclaim").write_text("")
    (cg / "memory.stat").write_text("anon 1000\nfile 4294967296\nkernel 12\n")

    plan = host.plan()
    assert plan.method == "cgroup2-memory.reclaim"
    assert plan.target == str(cg / "memory.reclaim")
    assert plan.cgroup == "/user.slice/trainer.scope"
    assert plan.page_cache_bytes == (6000000 + 100000) * 1024
    assert plan.mem_available_bytes == 2500000 * 1024

    result = host.execute()
    assert result.ok and result.via == "direct", result.message
    assert (cg / "memory.reclaim").read_text() == "4294967296 swappiness=0"
    assert result.before == {"mem_available_bytes": 2500000 * 1024, "page_cache_bytes": 6100000 * 1024}
    assert "page cache 5.82 GiB ->" in result.message


def test_a_kernel_without_the_swappiness_key_gets_the_plain_byte_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(tmp_path, "0::/job\n")
    cg = host.cgroup_dir("job")
    (cg / "memory.reclaim").write_text("")
    (cg / "memory.stat").write_text("file 1048576\n")
    real_write = os.write

    def kernel_write(fd: int, data: bytes) -> int:  # what a pre-6.x kernel answers to the key
        if b"swappiness" in data:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", kernel_write)
    result = host.execute()
    assert result.ok, result.message
    assert (cg / "memory.reclaim").read_text() == "1048576"


def test_hybrid_host_finds_memory_reclaim_under_unified(tmp_path: Path) -> None:
    host = Host(tmp_path, "4:memory:/docker/abc\n0::/docker/abc\n")
    cg = host.cgroup_dir("unified", "docker", "abc")
    (cg / "memory.reclaim").write_text("")
    assert host.plan().target == str(cg / "memory.reclaim")


def test_v1_with_other_tasks_falls_to_drop_caches(tmp_path: Path) -> None:
    host = Host(tmp_path, "4:memory:/docker/abc\n0::/\n")
    cg = host.cgroup_dir("memory", "docker", "abc")
    (cg / "memory.force_empty").write_text("")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n999999\n")

    plan = host.plan()
    assert plan.method == "drop_caches"
    assert plan.target == str(host.drop_caches)
    assert any("memory.reclaim" in why for why in plan.passed_over)
    assert any("1 other task(s) in /docker/abc (999999)" in why for why in plan.passed_over)

    result = host.execute()
    assert result.ok, result.message
    assert host.drop_caches.read_text() == "1"
    assert (cg / "memory.force_empty").read_text() == ""


def test_v1_force_empty_when_only_we_are_in_the_cgroup(tmp_path: Path) -> None:
    host = Host(tmp_path, "9:memory,hugetlb:/trainroom/run1\n")
    cg = host.cgroup_dir("memory", "trainroom", "run1")
    (cg / "memory.force_empty").write_text("")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")

    plan = host.plan()
    assert plan.method == "cgroup1-memory.force_empty"
    result = host.execute()
    assert result.ok, result.message
    assert (cg / "memory.force_empty").read_text() == "0"


def test_v1_root_cgroup_is_never_force_emptied(tmp_path: Path) -> None:
    host = Host(tmp_path, "4:memory:/\n")
    cg = host.cgroup_dir("memory")
    (cg / "memory.force_empty").write_text("")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")
    plan = host.plan()
    assert plan.method == "drop_caches"
    assert any("hierarchy's root" in why for why in plan.passed_over)


def test_denied_without_sudo_gives_the_exact_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deny: Callable[[Path], None]
) -> None:
    host = Host(tmp_path, "0::/\n")
    deny(host.drop_caches)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))  # no sudo anywhere

    result = host.execute()
    assert result.ok is False and result.via is None
    expected = f"sudo sh -c 'sync; echo 1 > {host.drop_caches}'"
    assert result.manual_command == expected
    assert "sudo is not installed" in result.message
    assert result.message.endswith(f"run by hand: {expected}")
    assert host.drop_caches.read_text() == ""


def test_denied_with_a_sudo_that_needs_a_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deny: Callable[[Path], None]
) -> None:
    host = Host(tmp_path, "0::/\n")
    deny(host.drop_caches)
    stub_sudo(tmp_path / "bin", monkeypatch, works=False)

    result = host.execute()
    assert result.ok is False
    assert "sudo -n: sudo: a password is required" in result.message
    assert result.manual_command in result.message
    assert host.drop_caches.read_text() == ""


def test_denied_then_done_through_a_working_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deny: Callable[[Path], None]
) -> None:
    host = Host(tmp_path, "0::/\n")
    deny(host.drop_caches)
    stub_sudo(tmp_path / "bin", monkeypatch, works=True)

    lines: list[str] = []
    result = host.execute(progress=lines.append)
    assert result.ok and result.via == "sudo", result.message
    assert host.drop_caches.read_text().strip() == "1"
    assert any("trying sudo -n" in line for line in lines)


def test_no_sudo_fallback_when_disabled(tmp_path: Path, deny: Callable[[Path], None]) -> None:
    host = Host(tmp_path, "0::/\n")
    deny(host.drop_caches)
    result = host.execute(use_sudo=False)
    assert result.ok is False and "run by hand: sudo sh -c" in result.message


def test_wsl_is_detected_and_says_what_windows_gets_back(tmp_path: Path) -> None:
    host = Host(tmp_path, "0::/\n", version="Linux version 5.15.153.1-microsoft-standard-WSL2")
    plan = host.plan()
    assert plan.wsl is True
    assert plan.wsl_note is not None and "about 5.82 GiB" in plan.wsl_note and "Windows" in plan.wsl_note
    assert detect_wsl(tmp_path / "nowhere", env={"WSL_DISTRO_NAME": "Ubuntu"}) is True
    assert detect_wsl(host.proc, env={}) is True
    assert Host(tmp_path / "plain", "0::/\n").plan().wsl is False


def test_method_can_be_forced(tmp_path: Path) -> None:
    host = Host(tmp_path, "0::/job\n")
    cg = host.cgroup_dir("job")
    (cg / "memory.reclaim").write_text("")
    assert host.plan().method == "cgroup2-memory.reclaim"
    assert host.plan(method="drop_caches").method == "drop_caches"


def test_memory_figures_of_a_missing_meminfo(tmp_path: Path) -> None:
    assert memory_figures(tmp_path) == {"mem_available_bytes": None, "page_cache_bytes": None}


@pytest.mark.realdrop
@pytest.mark.skipif(
    os.environ.get("TRAINROOM_REAL_DROP") != "1",
    reason="writes the real /proc/sys/vm/drop_caches or cgroup files: opt in with TRAINROOM_REAL_DROP=1",
)
def test_real_drop_on_this_machine() -> None:
    before = memory_figures()
    assert before["page_cache_bytes"] is not None
    result = execute_reclaim()
    print(result.message)
    if not result.ok:
        # A host that denies it must say exactly what to run instead.
        assert result.manual_command.startswith("sudo sh -c ") and result.manual_command in result.message
    else:
        assert result.after["page_cache_bytes"] is not None
