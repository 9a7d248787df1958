"""Host memory: MemAvailable and the page cache from /proc/meminfo, and the limit and usage of the
cgroup this process lives in (v1 or v2), since a container or a systemd slice can run out long
before the host does.

Scenario 13: torch.load fails with ENOMEM (disguised as `SystemError: readinto`) once
less than ~3 GB is free, while gigabytes sit in the page cache that a reclaim would return. So the
sample carries both what is available and what is reclaimable. Roots are injectable for tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from trainroom.core.samples import CgroupMemory, HostSample
from trainroom.core.vocab import CgroupVersion

PROC = "/proc"
MEMINFO = f"{PROC}/meminfo"
CGROUP = "/sys/fs/cgroup"
# cgroup v1 says "no limit" with a page-rounded LONG_MAX; anything this big is no limit.
_NO_LIMIT = 1 << 62


def read_meminfo(path: str | os.PathLike[str] = MEMINFO) -> dict[str, int]:
    """/proc/meminfo as bytes per key (the file says kB, and means KiB); empty when it cannot be
    read, so a caller takes a missing key as "unknown". The one parser: the host probe, the
    verifier's RAM check, reclaim and resume all read it here."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[name.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_stat(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                try:
                    out[k] = int(v)
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def cgroup_memory(
    proc_root: str = PROC, cgroup_root: str = CGROUP, mem_total: int | None = None
) -> CgroupMemory | None:
    """This process's memory cgroup; None when no cgroup memory view exists.

    v1 (or hybrid) names the memory controller on its own line of /proc/self/cgroup; pure v2 has
    one `0::/path` line. A path that does not exist under the root (a cgroup namespace shows "/")
    falls back to the root itself. `limit_bytes` is None for "no limit" (or a limit above RAM).
    """
    try:
        with open(f"{proc_root}/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1_path = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]

    def locate(base: str, rel: str, probe: str) -> str | None:
        for d in (os.path.join(base, rel.lstrip("/")), base):
            if os.path.exists(os.path.join(d, probe)):
                return d
        return None

    version: CgroupVersion
    if v1_path is not None:
        d = locate(os.path.join(cgroup_root, "memory"), v1_path, "memory.usage_in_bytes")
        if d is None:
            return None
        version, limit = 1, _read_int(os.path.join(d, "memory.limit_in_bytes"))
        usage = _read_int(os.path.join(d, "memory.usage_in_bytes"))
        stat = _read_stat(os.path.join(d, "memory.stat"))
        file_bytes = stat.get("total_cache", stat.get("cache"))
        inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
        reclaim = None
        path = v1_path
    elif v2_path is not None:
        base = (
            cgroup_root
            if os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
            else os.path.join(cgroup_root, "unified")
        )
        d = locate(base, v2_path, "memory.current")
        if d is None:
            return None
        version, limit = 2, _read_int(os.path.join(d, "memory.max"))
        usage = _read_int(os.path.join(d, "memory.current"))
        stat = _read_stat(os.path.join(d, "memory.stat"))
        file_bytes, inactive = stat.get("file"), stat.get("inactive_file")
        # memory.reclaim (kernel >= 5.19) frees page cache gradually, without drop_caches' hammer.
        rf = os.path.join(d, "memory.reclaim")
        reclaim = rf if os.path.exists(rf) else None
        path = v2_path
    else:
        return None
    if limit is not None and (limit >= _NO_LIMIT or (mem_total is not None and limit >= mem_total)):
        limit = None
    available = None
    if limit is not None and usage is not None:
        # Usage counts page cache; the inactive part of it goes first under pressure.
        available = max(0, limit - usage + (inactive or 0))
    return CgroupMemory(
        version=version,
        path=path,
        dir=d,
        limit_bytes=limit,
        usage_bytes=usage,
        file_bytes=file_bytes,
        inactive_file_bytes=inactive,
        available_bytes=available,
        reclaim_file=reclaim,
    )


def is_wsl(proc_root: str = PROC) -> bool:
    """WSL2 (or WSL1): its kernel says Microsoft. Under WSL ghost VRAM needs a VM restart."""
    if os.environ.get("WSL_DISTRO_NAME"):
        return True
    for name in ("sys/kernel/osrelease", "version"):
        try:
            with open(f"{proc_root}/{name}") as f:
                if "microsoft" in f.read().lower():
                    return True
        except OSError:
            continue
    return False


class HostProbe:
    """Host RAM, once a probe cycle. `sample()` never raises: a failure is `available=False`."""

    def __init__(
        self, *, proc_root: str = PROC, cgroup_root: str = CGROUP, clock: Callable[[], float] = time.time
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.clock = clock
        self._wsl = is_wsl(proc_root)

    def sample(self) -> HostSample:
        t = self.clock()
        path = f"{self.proc_root}/meminfo"
        mem = read_meminfo(path)
        if not mem:
            return HostSample(
                t=t,
                available=False,
                reason=f"host memory view unavailable: cannot read {path}",
                wsl=self._wsl,
            )
        total = mem.get("MemTotal")
        avail = mem.get("MemAvailable")
        if avail is None and total is not None:  # kernels before 3.14: a rough equivalent
            avail = mem.get("MemFree", 0) + mem.get("Cached", 0) + mem.get("Buffers", 0)
        try:
            cg = cgroup_memory(self.proc_root, self.cgroup_root, total)
        except OSError:
            cg = None
        effective = avail
        if cg is not None and cg.available_bytes is not None and avail is not None:
            effective = min(avail, cg.available_bytes)
        return HostSample(
            t=t,
            available=avail is not None,
            reason="" if avail is not None else "host memory view unavailable: no MemAvailable",
            mem_total_bytes=total,
            mem_available_bytes=avail,
            page_cache_bytes=mem.get("Cached", 0) + mem.get("Buffers", 0),
            swap_total_bytes=mem.get("SwapTotal"),
            swap_free_bytes=mem.get("SwapFree"),
            cgroup=cg,
            effective_available_bytes=effective,
            wsl=self._wsl,
        )
