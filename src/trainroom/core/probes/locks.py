"""Lock files: who holds each configured lock, from /proc/locks matched by major:minor:inode.

/proc/locks names the pid that TOOK the lock. An flock belongs to the open file, so a child that
inherited the descriptor keeps it after that pid is gone, and /proc/locks goes on naming the dead
taker (scenario 10: relaunches aborted on a lock whose owner did not exist). So when the
named holder is gone or a zombie, the processes that still keep the lock are found through their
/proc/<pid>/fdinfo, whose `lock:` lines list the locks held through that descriptor.

Line format (fs/locks.c): `1: FLOCK  ADVISORY  WRITE 7124 fe:00:2146735 0 EOF`, a blocked waiter
as `1: -> FLOCK ...`; the device is `%02x:%02x` (hex major:minor), the inode decimal. In a PID
namespace other than the taker's the pid reads 0 (the taker is gone) or -1 (OFD locks).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec

from trainroom.core.probes.procs import PROC, read_stat, state_name
from trainroom.core.samples import LockHolder, LockInfo


def lock_key(path: str) -> str | None:
    """'major:minor:inode' of a file as /proc/locks spells it, or None if the file is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


class LockLine(msgspec.Struct, kw_only=True, frozen=True):
    """One line of /proc/locks (or an fdinfo `lock:` line)."""

    id: int
    kind: str  # FLOCK, POSIX, OFDLCK, LEASE
    advisory: str
    mode: str  # READ, WRITE
    pid: int  # the taker; 0 or -1 when it is in another PID namespace
    key: str  # major:minor:inode
    waiter: bool  # a blocked waiter (`->`), not a holder


def parse_locks(text: str) -> list[LockLine]:
    """Each line of /proc/locks (or an fdinfo `lock:` line without its prefix)."""
    out = []
    for line in text.splitlines():
        parts = line.removeprefix("lock:").split()
        if len(parts) < 5:
            continue
        waiter = parts[1] == "->"
        if waiter:
            parts = [parts[0], *parts[2:]]
        try:
            lock_id = int(parts[0].rstrip(":"))
            kind, advisory, mode, pid, dev_inode = parts[1], parts[2], parts[3], int(parts[4]), parts[5]
        except (IndexError, ValueError):
            continue
        major, _, rest = dev_inode.partition(":")
        minor, _, inode = rest.partition(":")
        try:
            key = f"{int(major, 16):02x}:{int(minor, 16):02x}:{int(inode)}"
        except ValueError:
            continue
        out.append(
            LockLine(id=lock_id, kind=kind, advisory=advisory, mode=mode, pid=pid, key=key, waiter=waiter)
        )
    return out


def _describe(pid: int, proc_root: str, kind: str | None = None, mode: str | None = None) -> LockHolder:
    st = read_stat(pid, proc_root) if pid > 0 else None
    return LockHolder(
        pid=pid,
        exists=st is not None,
        state=st.state if st is not None else None,
        state_name=state_name(st.state if st is not None else None),
        pgid=st.pgid if st is not None else None,
        comm=st.comm if st is not None else None,
        kind=kind,
        mode=mode,
    )


def fd_lock_holders(key: str, proc_root: str = PROC) -> list[int]:
    """Pids that hold a lock on the file `key` through one of their descriptors (fdinfo `lock:`).
    Each descriptor is stat()ed first (one syscall) and only one on the lock file is read.
    Processes of other users are unreadable and skipped: the lock files are the user's own."""
    major, minor, inode = key.split(":")
    dev, ino = os.makedev(int(major, 16), int(minor, 16)), int(inode)
    holders = []
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        fd_dir = f"{proc_root}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
                if st.st_ino != ino or st.st_dev != dev:
                    continue
                with open(f"{proc_root}/{name}/fdinfo/{fd}") as f:
                    text = f.read()
            except OSError:
                continue
            if any(lk.key == key and not lk.waiter for lk in parse_locks(text)):
                holders.append(int(name))
                break
    return sorted(holders)


def lock_holders(paths: Iterable[str], *, proc_root: str = PROC) -> list[LockInfo]:
    """For each configured lock file: who holds it, who inherited it, who waits.

    holders: what /proc/locks names; inheritors: the live processes that still hold it through an
    inherited descriptor, looked up only when a named holder is gone, a zombie, or unknown
    (pid <= 0); waiters: pids blocked on it.
    """
    try:
        with open(f"{proc_root}/locks") as f:
            table = parse_locks(f.read())
    except OSError:
        table = []
    return [_lock_info(path, table, proc_root) for path in paths]


def _lock_info(path: str, table: list[LockLine], proc_root: str) -> LockInfo:
    key = lock_key(path)
    if key is None:
        return LockInfo(path=path)
    holders: list[LockHolder] = []
    waiters: list[int] = []
    for lk in table:
        if lk.key != key:
            continue
        if lk.waiter:
            waiters.append(lk.pid)
        elif all(h.pid != lk.pid for h in holders):
            holders.append(_describe(lk.pid, proc_root, lk.kind, lk.mode))
    inheritors: list[LockHolder] = []
    if any(h.gone for h in holders):
        named = {h.pid for h in holders}
        inheritors = [
            _describe(pid, proc_root) for pid in fd_lock_holders(key, proc_root) if pid not in named
        ]
    return LockInfo(
        path=path,
        key=key,
        exists=True,
        held=bool(holders),
        holders=holders,
        inheritors=inheritors,
        waiters=waiters,
    )
