"""The trainer SDK: three lines to adopt, and a no-op when the trainer is not under a keeper.

    from trainroom.core import sdk
    rep = sdk.connect(lr=3e-4, vocab_size=50257)
    ...
    rep.step(step, loss=loss.item(), tokens=tokens_seen, grad_norm=gn, optimizer=opt)

The reporter never blocks the training loop: frames go into a bounded queue that drops the oldest
(and counts what it dropped), and a non-blocking send drains as much as the socket takes; what a
partial send leaves is sent first next time, so frames are never torn. Each step is sent at once by
default, so a trainer killed or stopped right after a step has told the keeper that step; with a
send window (`TRAINROOM_SEND_WINDOW_MS`, or `Reporter(send_window_s=...)`) steps closer together
go out in one send (a loop at thousands of steps a second pays one system call per window, at the
cost of the window's last steps when the process dies inside it); the heartbeat thread sends what a
stopped loop left waiting. A daemon thread sends a
heartbeat each second, carrying where the main thread is, so the keeper tells a stalled loop
(moving, no steps) from a hung one (parked on one line, or no heartbeat at all). Uncaught exceptions
send a Crash with the whole cause chain; SIGUSR1 dumps every thread's stack into the trainer log.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, get_args

import msgspec

from trainroom.core.vocab import PhaseName
from trainroom.core.wire import framing
from trainroom.core.wire import protocol as p
from trainroom.core.wire.protocol import error_chain

if TYPE_CHECKING:
    import torch

QUEUE_FRAMES = 4096
SNDBUF_BYTES = 1 << 20
# A step within HOLD_S of the last send waits (at most HOLD_S, or until HOLD_FRAMES wait) and goes
# out with the ones after it; a step after a quiet HOLD_S goes out at once. While the socket is full
# (a keeper that stopped reading) a send is tried once a window, not at every step.
HOLD_S = 0.01  # the window a send window of "on" means (scripts/bench_reporter.py --window)


def _window_from_env() -> float:
    """The send window the environment asks for (TRAINROOM_SEND_WINDOW_MS), in seconds; 0 (every
    step sent at once) when unset or not a number from 0 to 1000."""
    try:
        ms = float(os.environ.get("TRAINROOM_SEND_WINDOW_MS", "0"))
    except ValueError:
        return 0.0
    return ms / 1000.0 if 0.0 <= ms <= 1000.0 else 0.0


HOLD_FRAMES = 128
# One send carries at most this many queued frames (what a keeper that vanishes mid-send loses).
SEND_FRAMES = 256
_NOSIGNAL = socket.MSG_NOSIGNAL
_clock = time.time
# The step's frame, built without a lookup or a call more than it needs (what `p.frame` does).
_Step = p.Step
_encode = framing._encoder.encode
_header = framing.HEADER.pack


class Reporter:
    """Sends telemetry to the keeper at `sock_path`. Use `connect()` rather than this directly."""

    def __init__(
        self, sock_path: str, hello: p.Hello, heartbeat_s: float = 1.0, send_window_s: float | None = None
    ) -> None:
        self.sock_path = sock_path
        self._window = _window_from_env() if send_window_s is None else max(0.0, float(send_window_s))
        self.rank = hello.rank
        self._hello = hello
        self._lock = threading.Lock()
        self._queue: collections.deque[bytes] = collections.deque(maxlen=QUEUE_FRAMES)
        self._partial: memoryview | None = None
        self._sock: socket.socket | None = None
        self._phase: PhaseName = "train"
        self._closed = False
        self.dropped = 0
        self.invalid = 0  # steps dropped because the keeper would refuse them (negative, not an int)
        self.last_step: int | None = None
        self._heartbeat_s = heartbeat_s
        self._main = threading.main_thread()
        self._frame_key: tuple[str, int] | None = None
        self._frame_since = time.monotonic()
        self._sent_t = 0.0  # time.time() of the last send (or try: a full socket counts)
        # ... and of the last step sent at once: only steps open a window (a heartbeat, a phase or
        # a note just before a step must not hold it: a loop stopped right after would lose it).
        self._step_t = 0.0
        self._blocked = False  # the last try left frames: the socket is full (a keeper not reading)
        self._held = False  # steps wait for the window: the heartbeat thread was woken to send them
        self._wake = threading.Event()
        self._connect()
        self._thread = threading.Thread(target=self._beat, name="trainroom-heartbeat", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- the public API

    @property
    def active(self) -> bool:
        return True

    def step(
        self,
        step: int,
        *,
        loss: float | None = None,
        tokens: int | None = None,
        grad_norm: float | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr: list[float] | float | None = None,
        loss_scale: float | None = None,
        alloc: tuple[int, int, int] | None = None,
        batch: p.BatchRef | Mapping[str, Any] | None = None,
    ) -> None:
        """Report one optimizer step. Cheap: a struct, an encode, a queue append, one send.
        `alloc` (allocated, reserved, peak bytes) overrides what torch.cuda says. `batch` names
        the batch it trained on (`{"epoch": 0, "index": 135, "seed": 42}`, sample `ids`, or a
        `tag`): what `trainroom replay` hands back. A step the keeper would refuse (negative,
        not an integer) is dropped and counted, never raised, and so is a batch it would refuse
        (the step goes without it): the reporter must not break the training loop."""
        if (type(step) is not int and (isinstance(step, bool) or not isinstance(step, int))) or step < 0:
            self.invalid += 1
            return
        if lr is None:
            lrs = [] if optimizer is None else [float(g["lr"]) for g in optimizer.param_groups]
        elif isinstance(lr, (int, float)):
            lrs = [float(lr)]
        else:
            lrs = list(lr or [])
        stats = alloc or _allocator_stats()
        self.last_step = step
        ref = None
        if batch is not None:
            ref = batch_ref(batch)
            if ref is None:
                self.invalid += 1
        now = _clock()
        body = _encode(
            _Step(
                step=step,
                t=now,
                tokens=tokens,
                loss=None if loss is None else float(loss),
                grad_norm=None if grad_norm is None else float(grad_norm),
                lr=lrs,
                loss_scale=None if loss_scale is None else float(loss_scale),
                alloc_allocated=stats[0],
                alloc_reserved=stats[1],
                alloc_peak=stats[2],
                batch=ref,
            )
        )
        data = _header(len(body)) + body
        # The hot path takes no lock: an append to the deque is atomic, and only a send (under
        # the lock, here or in the heartbeat thread) takes frames out.
        queue = self._queue
        if len(queue) == QUEUE_FRAMES:
            self.dropped += 1
        queue.append(data)
        if self._sock is None:
            return  # queued for the next connection
        window = self._window
        if (now - self._step_t < window and len(queue) < HOLD_FRAMES) or (
            self._blocked and now - self._sent_t < HOLD_S
        ):
            if not self._held:
                self._held = True
                self._wake.set()
            return
        self._step_t = now
        with self._lock:
            self._drain()

    @contextlib.contextmanager
    def phase(self, name: PhaseName, bound_s: float | None = None) -> Iterator[None]:
        """A phase that is not a stall for as long as `bound_s` (the keeper's default otherwise)."""
        prev = self._phase
        self._phase = name
        self._send(p.Phase(name=name, t=time.time(), bound_s=bound_s))
        try:
            yield
        finally:
            self._phase = prev
            # A name outside the protocol's would end the connection: fall back to train.
            self._send(p.Phase(name=prev if prev in _PHASES else "train", t=time.time()))

    def checkpoint(
        self, path: str, step: int, size_bytes: int | None = None, digest: str | None = None
    ) -> None:
        self._send(
            p.Checkpoint(path=str(path), step=step, t=time.time(), size_bytes=size_bytes, digest=digest)
        )

    def note(self, kind: str, message: str = "", step: int | None = None, **data: object) -> None:
        if step is not None and (not isinstance(step, int) or step < 0):
            step = None
        self._send(p.Note(kind=kind[:256], t=time.time(), message=message[:16384], step=step, data=data))

    def crash(self, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        chain = [
            msgspec.structs.replace(link, type=link.type[:16384], message=link.message[:16384])
            for link in error_chain(exc)[-64:]
        ]
        self._send(p.Crash(t=time.time(), chain=chain, traceback=tb[-20000:]))
        self.flush(timeout_s=1.0)

    def close(self, reason: str = "finished") -> None:
        if self._closed:
            return
        self._send(p.Bye(t=time.time(), reason=reason))
        self.flush(timeout_s=1.0)
        self._closed = True
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def flush(self, timeout_s: float = 1.0) -> bool:
        """Drain the queue, waiting up to `timeout_s` (at exit or on a crash only)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                self._drain()
                if not self._queue and self._partial is None:
                    return True
                if self._sock is None:
                    self._connect_locked()
            time.sleep(0.005)
        return False

    # ----------------------------------------------------------------- sending

    def _send(self, msg: p.TrainerMsg) -> None:
        data = p.frame(msg)
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
            self._queue.append(data)
            if self._sock is not None:
                self._drain()

    def _drain(self) -> None:
        sock = self._sock
        if sock is None:
            return
        queue = self._queue
        try:
            while True:
                if self._partial is None:
                    n = min(len(queue), SEND_FRAMES)
                    if not n:
                        return
                    chunk = queue.popleft() if n == 1 else b"".join([queue.popleft() for _ in range(n)])
                    self._partial = memoryview(chunk)
                # MSG_NOSIGNAL: a keeper that went away is EPIPE here, never a SIGPIPE that
                # kills a trainer running with SIGPIPE at its default.
                self._sent_t = _clock()
                sent = sock.send(self._partial, _NOSIGNAL)
                if sent == len(self._partial):
                    self._partial = None
                    self._blocked = False
                else:
                    self._partial = self._partial[sent:]
                    self._blocked = True
                    return
        except (BlockingIOError, InterruptedError):
            self._blocked = True
            return
        except OSError:
            # The keeper went away: a torn frame must not reach the next connection.
            self._partial = None
            self._blocked = False
            sock.close()
            self._sock = None

    def _connect(self) -> None:
        with self._lock:
            self._connect_locked()

    def _connect_locked(self) -> None:
        if self._closed:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            s.settimeout(0.5)
            s.connect(self.sock_path)
            s.setblocking(False)
        except OSError:
            s.close()
            return
        self._sock = s
        self._partial = None
        # Hello goes first on every connection, ahead of whatever queued meanwhile.
        self._queue.appendleft(p.frame(self._hello))
        self._drain()

    # ----------------------------------------------------------------- heartbeat thread

    def _main_frame(self) -> tuple[str | None, float | None]:
        frame = sys._current_frames().get(self._main.ident or -1)
        if frame is None:
            return None, None
        code = frame.f_code
        key = (code.co_filename, frame.f_lineno)
        now = time.monotonic()
        if key != self._frame_key:
            self._frame_key, self._frame_since = key, now
        return (
            f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}",
            now - self._frame_since,
        )

    def _running(self) -> bool:
        return not self._closed

    def _beat(self) -> None:
        next_beat = time.monotonic() + self._heartbeat_s
        while self._running():
            wait = next_beat - time.monotonic()
            if wait > 0 and self._wake.wait(wait):
                time.sleep(self._window)  # the window held steps wait in: the loop may send them itself
                self._wake.clear()
                self._held = False
                with self._lock:
                    self._drain()
                continue
            if not self._running():  # closed while this thread slept
                return
            next_beat = time.monotonic() + self._heartbeat_s
            frame, age = self._main_frame()
            with self._lock:
                if self._sock is None:
                    self._connect_locked()
            self._send(
                p.Heartbeat(
                    t=time.time(),
                    phase=self._phase,
                    main_frame=frame,
                    main_frame_age_s=None if age is None else round(age, 2),
                    dropped=self.dropped,
                )
            )


class NullReporter:
    """What `connect()` returns when the trainer is not under a keeper: every call does nothing."""

    rank = 0
    dropped = 0
    last_step: int | None = None

    @property
    def active(self) -> bool:
        return False

    def step(self, step: int, **_: object) -> None:
        self.last_step = step

    @contextlib.contextmanager
    def phase(self, name: PhaseName, bound_s: float | None = None) -> Iterator[None]:
        yield

    def checkpoint(self, *_: object, **__: object) -> None:
        pass

    def note(self, *_: object, **__: object) -> None:
        pass

    def crash(self, exc: BaseException) -> None:
        pass

    def close(self, reason: str = "finished") -> None:
        pass

    def flush(self, timeout_s: float = 1.0) -> bool:
        return True


_PHASES: frozenset[str] = frozenset(get_args(PhaseName))
_current: Reporter | NullReporter = NullReporter()


def current() -> Reporter | NullReporter:
    """The reporter `connect()` made (a no-op one before that or outside a keeper)."""
    return _current


def connect(
    lr: float | None = None,
    vocab_size: int | None = None,
    warmup_steps: int | None = None,
    arch: Mapping[str, object] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    sock_path: str | None = None,
) -> Reporter | NullReporter:
    """Connect to the keeper named by TRAINROOM_SOCKET; a no-op reporter when it is not set."""
    global _current
    path = sock_path or os.environ.get("TRAINROOM_SOCKET")
    if not path:
        _current = NullReporter()
        return _current
    if isinstance(_current, Reporter):
        return _current
    hello = p.Hello(
        pid=os.getpid(),
        rank=int(os.environ.get("RANK", 0)) if rank is None else rank,
        world_size=int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size,
        config=p.RequestedConfig(
            lr=lr, vocab_size=vocab_size, warmup_steps=warmup_steps, arch=dict(arch or {})
        ),
        argv=list(sys.argv),
    )
    rep = Reporter(path, hello)
    _current = rep
    _install_hooks(rep)
    return rep


def _install_hooks(rep: Reporter) -> None:
    prev_hook = sys.excepthook

    def excepthook(tp: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                rep.crash(exc)
        prev_hook(tp, exc, tb)

    sys.excepthook = excepthook
    prev_thread_hook = threading.excepthook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and args.thread is threading.main_thread():
            with contextlib.suppress(Exception):
                rep.crash(args.exc_value)
        prev_thread_hook(args)

    threading.excepthook = thread_hook
    with contextlib.suppress(ValueError, OSError, AttributeError, RuntimeError):
        # The trainer's stderr is the run's trainer.log: `trainroom dump` reads the stacks there.
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    atexit.register(rep.close, "exit")


def _allocator_stats() -> tuple[int | None, int | None, int | None]:
    """Allocator bytes from torch.cuda, only if the trainer already imported torch and uses CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None, None
    try:
        if not torch.cuda.is_initialized():
            return None, None, None
        return (
            int(torch.cuda.memory_allocated()),
            int(torch.cuda.memory_reserved()),
            int(torch.cuda.max_memory_allocated()),
        )
    except Exception:
        return None, None, None


def batch_ref(batch: p.BatchRef | Mapping[str, Any] | None) -> p.BatchRef | None:
    """A batch identity as the protocol carries it; None for none, or one it would refuse."""
    if batch is None or isinstance(batch, p.BatchRef):
        return batch
    try:
        return msgspec.convert(dict(batch), p.BatchRef)
    except (msgspec.ValidationError, TypeError, ValueError):
        return None
