"""NCCL's flight recorder, triggered for one rank where the trainer enabled it.

ProcessGroupNCCL keeps the last collectives in a ring (TORCH_NCCL_TRACE_BUFFER_SIZE, or
TORCH_FR_BUFFER_SIZE, > 0) and, when TORCH_NCCL_DEBUG_INFO_PIPE_FILE is set, its watchdog makes a
named pipe `<that path><rank>.pipe`: writing to it dumps the ring to
`<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>` (default /tmp/nccl_trace_rank_<rank>) without waiting
for NCCL's own timeout. Gloo and CPU runs have no such recorder: the stacks are the evidence then.
Read from the rank's environment (/proc/PID/environ, same user); never blocks (O_NONBLOCK).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import msgspec

DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
ENABLE_HINT = (
    "set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/nccl_pipe_ in the "
    "trainer's environment (NCCL only: gloo and CPU runs have no flight recorder)"
)


class FlightRecorder(msgspec.Struct, kw_only=True):
    triggered: bool
    detail: str
    dump_path: str | None = None


def _environ(pid: int, proc_root: str) -> dict[str, str]:
    raw = Path(proc_root, str(pid), "environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def trigger(pid: int, rank: int, proc_root: str = "/proc") -> FlightRecorder:
    try:
        env = _environ(pid, proc_root)
    except OSError as exc:
        return FlightRecorder(triggered=False, detail=f"cannot read pid {pid}'s environment: {exc.strerror}")
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    pipe_prefix = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not size.isdigit() or int(size) <= 0 or not pipe_prefix:
        return FlightRecorder(triggered=False, detail=f"flight recorder not enabled: {ENABLE_HINT}")
    pipe = f"{pipe_prefix}{rank}.pipe"
    dump = f"{env.get('TORCH_NCCL_DEBUG_INFO_TEMP_FILE', DEFAULT_DUMP_PREFIX)}{rank}"
    try:
        # Never through a symlink planted at the path, never into anything but a FIFO.
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        # ENXIO: nobody reads the pipe (no NCCL watchdog in this process yet).
        why = (
            "no NCCL watchdog reads it"
            if exc.errno == errno.ENXIO
            else "a symbolic link, not the FIFO NCCL makes: refused, nothing written"
            if exc.errno == errno.ELOOP
            else exc.strerror
        )
        return FlightRecorder(triggered=False, detail=f"flight recorder pipe {pipe}: {why}")
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return FlightRecorder(
                triggered=False,
                detail=f"flight recorder pipe {pipe}: not a FIFO (NCCL makes one): refused, nothing written",
            )
        os.write(fd, b"1")
    finally:
        os.close(fd)
    return FlightRecorder(triggered=True, detail=f"flight recorder dump asked through {pipe}", dump_path=dump)
