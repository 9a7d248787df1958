"""Delivery off the keeper's loop: one worker thread per channel, each with a bounded queue, a
rate limit, and retries with backoff. A receiver that hangs or fails holds up its own channel
only; the keeper only ever does a `put_nowait`, and a full queue drops the alert (journaled)
rather than wait.

Every outcome (delivered, retrying, failed, held, dropped) is reported through `report` from the
worker thread; the keeper turns it into a NotifyResult record on its loop (see alerts.py).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable

import msgspec

from trainroom.core.configuration import sections
from trainroom.core.notify import alert as alerts
from trainroom.core.notify.alert import Alert
from trainroom.core.notify.channels import Channel, DeliveryError
from trainroom.core.vocab import NotifyOutcome
from trainroom.core.wire import protocol as p

Report = Callable[[p.NotifyResult], None]


class TokenBucket:
    """`per_min` sends at once, then one every 60/per_min seconds (a monotonic clock)."""

    def __init__(self, per_min: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_min)
        self.rate = per_min / 60.0
        self._clock = clock
        self._tokens = self.capacity
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self) -> bool:
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """How long until a token is there."""
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self.rate)


class Delivery(msgspec.Struct, kw_only=True):
    """One alert for one channel; `done` (a test's) gets the final result."""

    alert: Alert
    tries: int
    limited: bool = True  # counts against the rate limit (a test alert does not)
    done: concurrent.futures.Future[p.NotifyResult] | None = None


_STOP = Delivery(alert=alerts.test_alert(run="", host="", t=0.0, state=None), tries=0)


class ChannelWorker:
    """One channel's thread: takes deliveries in order, one at a time."""

    def __init__(self, channel: Channel, policy: sections.Notify, report: Report) -> None:
        self.channel = channel
        self.policy = policy
        self._report = report
        self._queue: queue.Queue[Delivery] = queue.Queue(maxsize=policy.queue)
        self._bucket = TokenBucket(policy.rate_per_min)
        self._held: list[Delivery] = []
        self._abort = threading.Event()  # closing: no more backoff waits, no more retries
        self._thread = threading.Thread(target=self._run, name=f"notify: {channel.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the keeper's side

    def offer(self, d: Delivery) -> bool:
        """Queue a delivery without waiting; False (and a `dropped` result) when the queue is full."""
        try:
            self._queue.put_nowait(d)
            return True
        except queue.Full:
            self._result(d, "dropped", detail=f"queue full ({self.policy.queue} waiting)")
            return False

    def close(self, timeout_s: float) -> None:
        """Let what is queued go out, for at most timeout_s; then cut retries short."""
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._abort.set()
        self._thread.join(1.0)

    # ------------------------------------------------------------------ the worker thread

    def _run(self) -> None:
        while True:
            try:
                d = self._queue.get(timeout=self._bucket.wait_s() if self._held else None)
            except queue.Empty:
                d = None
            if d is _STOP:
                if self._held:
                    self._send_held()
                return
            if d is not None:
                if not d.limited or self._bucket.take():
                    self._deliver(d)
                else:
                    self._held.append(d)
                    self._result(d, "held", detail="over the rate limit: goes out in the next digest")
            if self._held and self._bucket.take():
                self._send_held()

    def _send_held(self) -> None:
        held, self._held = self._held, []
        if len(held) == 1:
            self._deliver(held[0])
            return
        one = alerts.digest([d.alert for d in held], t=time.time())
        self._deliver(Delivery(alert=one, tries=max(d.tries for d in held)))

    def _deliver(self, d: Delivery) -> None:
        for n in range(1, d.tries + 1):
            try:
                detail = self.channel.send(d.alert, self.policy.timeout_s)
            except Exception as exc:  # a bug in a channel must not end its thread, nor lose the alert
                why = str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__} in the channel"
                last = n == d.tries or self._abort.is_set()
                self._result(d, "failed" if last else "retrying", try_n=n, detail=why)
                if last or self._abort.wait(self.backoff_s(n)):
                    if not last:
                        self._result(d, "failed", try_n=n, detail="not retried: the keeper is closing")
                    return
            else:
                self._result(d, "delivered", try_n=n, detail=detail)
                return

    def backoff_s(self, n: int) -> float:
        """The wait after failed try n: backoff_s, doubling, capped."""
        return min(self.policy.backoff_max_s, self.policy.backoff_s * 2.0 ** (n - 1))

    def _result(self, d: Delivery, outcome: NotifyOutcome, *, try_n: int = 0, detail: str = "") -> None:
        now = time.time()
        r = p.NotifyResult(
            t=now,
            channel=self.channel.name,
            outcome=outcome,
            kind=d.alert.kind,
            alert=d.alert.ident,
            severity=d.alert.severity,
            try_n=try_n,
            detail=detail,
            latency_s=round(now - d.alert.t, 3) if outcome in ("delivered", "failed") else None,
        )
        self._report(r)
        if d.done is not None and outcome in ("delivered", "failed", "dropped") and not d.done.done():
            d.done.set_result(r)


class Dispatcher:
    """The workers of every channel; `submit` fans an alert out without waiting on any."""

    def __init__(self, channels: list[Channel], policy: sections.Notify, report: Report) -> None:
        self.policy = policy
        self.workers = [ChannelWorker(c, policy, report) for c in channels]

    def submit(self, alert: Alert) -> None:
        for w in self.workers:
            w.offer(Delivery(alert=alert, tries=1 + self.policy.retries))

    def test(self, alert: Alert) -> list[concurrent.futures.Future[p.NotifyResult]]:
        """One try per channel, past the rate limit; each future gets that channel's result."""
        futures: list[concurrent.futures.Future[p.NotifyResult]] = []
        for w in self.workers:
            fut: concurrent.futures.Future[p.NotifyResult] = concurrent.futures.Future()
            w.offer(Delivery(alert=alert, tries=1, limited=False, done=fut))
            futures.append(fut)
        return futures

    def close(self, timeout_s: float) -> None:
        """Each channel gets the same deadline, in parallel (a hung one cannot starve the rest)."""
        threads = [threading.Thread(target=w.close, args=(timeout_s,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 2.0)
