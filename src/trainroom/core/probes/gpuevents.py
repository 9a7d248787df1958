"""Xids and falls off the bus as they happen, off the keeper's tick: a thread reads the kernel
log, another waits on NVML's critical-Xid events; both feed one bounded queue that the probe
cycle drains (`GpuEventWatch.take`), resolving each event's PCI bus id to an NVML device and to
whether this run's processes are on it.

The kernel log: /dev/kmsg opened non-blocking and read from its end (SEEK_END: what the kernel
said before the keeper started is not replayed), one record a read; where it cannot be read (no
CAP_SYSLOG under dmesg_restrict, a container without it) `journalctl -k -f -n 0 -o
short-monotonic`; where neither, the sample says why (`GpuSample.kernel_log`). Lines are cut at
xid.LINE_MAX and parsed linearly (probes.xid); the facility is not filtered on.
"""

from __future__ import annotations

import errno
import os
import queue
import select
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from trainroom.core.probes.gpu import LOST_WORDS, Nvml
from trainroom.core.probes.xid import LINE_MAX, LOST_XIDS, norm_bus, parse_kernel_line, xid_kind
from trainroom.core.samples import GpuEvent, GpuSample

KMSG = "/dev/kmsg"
JOURNALCTL = ("journalctl", "-k", "-f", "-n", "0", "-o", "short-monotonic", "--no-pager")
NVML_EVENTS = "nvml events"
KEEP = 32  # events kept per attempt (the oldest dropped)
QUEUE_MAX = 256
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15


class _Feed:
    """The bounded queue both readers put into; a full queue drops the newest (said once)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.q: queue.Queue[GpuEvent] = queue.Queue(QUEUE_MAX)
        self.clock = clock
        self.dropped = 0

    def put(self, ev: GpuEvent) -> None:
        try:
            self.q.put_nowait(ev)
        except queue.Full:
            self.dropped += 1


class KernelLog:
    """A thread reading the kernel log for GPU lines. `source` says what it reads."""

    def __init__(
        self,
        feed: _Feed,
        *,
        path: str = KMSG,
        journalctl: tuple[str, ...] | None = JOURNALCTL,
    ) -> None:
        self.feed = feed
        self.path = path
        self.journalctl = journalctl
        self.source = ""
        self._stop = threading.Event()
        self._fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Open the log (kmsg, else journalctl) and start reading; returns what it reads."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                pass  # a FIFO (a test's) has no end to seek to
            self._fd = fd
            self.source = self.path
        except OSError as exc:
            why = f"{self.path}: {exc.strerror or exc}"
            if self.journalctl is None:
                self.source = f"unavailable: {why}"
                return self.source
            try:
                self._proc = subprocess.Popen(
                    list(self.journalctl),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                self.source = "journalctl -k"
            except OSError as exc2:
                self.source = f"unavailable: {why}; journalctl: {exc2.strerror or exc2}"
                return self.source
        self._thread = threading.Thread(target=self._run, name="trainroom-kernel-log", daemon=True)
        self._thread.start()
        return self.source

    def _line(self, raw: bytes) -> None:
        parsed = parse_kernel_line(raw[:LINE_MAX].decode("utf-8", "replace"))
        if parsed is None:
            return
        src = "journalctl -k" if self._proc is not None else self.path
        self.feed.put(
            GpuEvent(
                t=self.feed.clock(),
                source=src,
                bus_id=parsed.bus_id,
                xid=parsed.xid,
                lost=parsed.lost,
                text=parsed.text[:500],
                pid=parsed.pid,
            )
        )

    def _run(self) -> None:
        if self._fd is not None:
            self._read_kmsg(self._fd)
        elif self._proc is not None and self._proc.stdout is not None:
            self._read_journal(self._proc)

    def _read_kmsg(self, fd: int) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], 0.25)
                if not ready:
                    continue
                data = os.read(fd, 8192)  # /dev/kmsg: one record a read
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # the ring buffer overwrote records we had not read: go on
                if exc.errno == errno.EINVAL:
                    continue  # a record larger than the buffer: skipped
                return
            if not data:
                self._stop.wait(0.25)  # a plain file at its end (tests), a FIFO with no writer
                continue
            for line in data.split(b"\n"):
                if line and not line.startswith(b" "):  # " KEY=value" lines continue a record
                    self._line(line)

    def _read_journal(self, proc: subprocess.Popen[bytes]) -> None:
        out = proc.stdout
        assert out is not None
        partial = False
        while not self._stop.is_set():
            line = out.readline(LINE_MAX)
            if not line:
                return
            if not partial:
                self._line(line)
            partial = not line.endswith(b"\n")  # the rest of an over-long line is skipped

    def close(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._thread is not None:
            self._thread.join(2)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class NvmlEvents:
    """A thread waiting on NVML's critical-Xid events for every device that supports them."""

    def __init__(self, feed: _Feed, nvml: Nvml, wait_ms: int = 500) -> None:
        self.feed = feed
        self.nvml: Any = nvml
        self.wait_ms = wait_ms
        self.source = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="trainroom-nvml-events", daemon=True)
        self._thread.start()
        return NVML_EVENTS

    def _setup(self) -> object | None:
        nv = self.nvml
        nv.nvmlInit()
        es: object = nv.nvmlEventSetCreate()
        registered, why = 0, ""
        for i in range(int(nv.nvmlDeviceGetCount())):
            try:
                nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), XID_CRITICAL, es)
                registered += 1
            except nv.NVMLError as exc:  # NotSupported on this device: a normal answer
                why = str(exc)
        if not registered:
            nv.nvmlEventSetFree(es)
            self.source = f"{NVML_EVENTS}: unavailable: {why or 'no device'}"
            return None
        self.source = f"{NVML_EVENTS} on {registered} device(s)"
        return es

    def _run(self) -> None:
        nv = self.nvml
        try:
            es = self._setup()
        except Exception as exc:
            self.source = f"{NVML_EVENTS}: unavailable: {exc}"
            return
        if es is None:
            return
        try:
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(es, self.wait_ms)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) == NVML_ERROR_TIMEOUT:
                        continue
                    self._stop.wait(1.0)  # GPU lost, driver gone: the probe says so; keep waiting
                    continue
                if not int(data.eventType) & XID_CRITICAL:
                    continue
                xid = int(data.eventData)
                try:
                    bus = norm_bus(nv.nvmlDeviceGetPciInfo(data.device).busId)
                except Exception:
                    bus = None
                self.feed.put(
                    GpuEvent(
                        t=self.feed.clock(),
                        source=NVML_EVENTS,
                        bus_id=bus,
                        xid=xid,
                        lost=xid in LOST_XIDS,
                        text=f"NVML critical Xid event: Xid {xid}",
                    )
                )
        finally:
            try:
                nv.nvmlEventSetFree(es)
                nv.nvmlShutdown()
            except Exception:
                pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 + self.wait_ms / 1000)


class GpuEventWatch:
    """Both readers, and what the probe cycle keeps of them: the events of the current attempt,
    each resolved to an NVML device and to whether the run is on it."""

    def __init__(
        self,
        nvml: Nvml | None,
        *,
        kmsg: str = KMSG,
        journalctl: tuple[str, ...] | None = JOURNALCTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.feed = _Feed(clock)
        self.kernel = KernelLog(self.feed, path=kmsg, journalctl=journalctl)
        self.nvml_events = NvmlEvents(self.feed, nvml) if nvml is not None else None
        self._started = False
        self._attempt = -1
        self._events: list[GpuEvent] = []
        self._bus_to_index: dict[str, int] = {}  # the last NVML answer (kept when it fails)
        self._run_devices: set[int] = set()  # devices the attempt's processes were seen on
        self._run_pids: set[int] = set()  # the attempt's processes the driver listed
        self._host_pids = True  # the keeper's pids are the kernel's (the host PID namespace)
        self._lost_said: set[int] = set()

    def start(self) -> str:
        """Start both readers; returns the kernel log's source in words."""
        self._started = True
        src = self.kernel.start()
        if self.nvml_events is not None:
            self.nvml_events.start()
        return src

    @property
    def source(self) -> str:
        nv = self.nvml_events.source if self.nvml_events is not None else ""
        return "; ".join(s for s in (self.kernel.source, nv) if s)

    def take(self, gpu: GpuSample, attempt: int) -> GpuSample:
        """The sample with this attempt's events (each resolved with what is known now) and the
        log's source."""
        if not self._started:
            self.start()
        if attempt != self._attempt:
            self._attempt, self._events, self._run_devices, self._lost_said = attempt, [], set(), set()
            self._run_pids = set()
        if gpu.available:
            for d in gpu.devices:
                if d.pci_bus_id:
                    self._bus_to_index[d.pci_bus_id] = d.index
            self._run_devices |= {x.device for x in gpu.processes if x.ours}
            self._run_pids |= {x.pid for x in gpu.processes if x.ours}
            self._host_pids = gpu.pid_namespace == "host"
        new: list[GpuEvent] = []
        while True:
            try:
                new.append(self.feed.q.get_nowait())
            except queue.Empty:
                break
        bus_of = {i: b for b, i in self._bus_to_index.items()}
        lost_now = {d.index: d.pci_bus_id or bus_of.get(d.index) for d in gpu.devices if d.lost}
        if not gpu.available and LOST_WORDS in gpu.reason and len(self._run_devices) == 1:
            # NVML will not even count the devices: the run's one device is the lost one.
            (only,) = self._run_devices
            lost_now[only] = bus_of.get(only)
        for index, bus in lost_now.items():  # NVML itself said GPU_IS_LOST
            if index in self._run_devices and index not in self._lost_said:
                self._lost_said.add(index)
                text = f"NVML: GPU is lost (device {index})"
                new.append(GpuEvent(t=gpu.t, source="nvml", bus_id=bus, lost=True, text=text))
        for ev in new:
            if not any(_same(ev, old) for old in self._events):
                self._events.append(ev)  # the kernel and NVML telling of one Xid, or a repeat: the first kept
        del self._events[:-KEEP]
        return msgspec.structs.replace(
            gpu, events=[self._resolved(e) for e in self._events], kernel_log=self.source
        )

    def _resolved(self, ev: GpuEvent) -> GpuEvent:
        """Its device (by bus id) and whether the run is on it, as known now: a line read before
        the run's processes were first listed counts once they are."""
        device = self._bus_to_index.get(ev.bus_id) if ev.bus_id else None
        runs = self._run_devices or (
            set(self._bus_to_index.values()) if len(self._bus_to_index) == 1 else set()
        )
        ours = device is not None and device in runs
        if (
            ours
            and ev.pid is not None
            and self._host_pids
            and self._run_pids
            and not xid_kind(ev.xid).critical
        ):
            # An application's own fault (13, 31, 43...) names its process: another one's, on a
            # shared GPU, is not this run's.
            ours = ev.pid in self._run_pids
        return msgspec.structs.replace(ev, device=device, ours=ours)

    def close(self) -> None:
        self.kernel.close()
        if self.nvml_events is not None:
            self.nvml_events.close()


def _same(a: GpuEvent, b: GpuEvent) -> bool:
    return (a.bus_id, a.xid, a.lost) == (b.bus_id, b.xid, b.lost)
