"""The keeper's alerts: it observes every record it emits and tells someone, with no control
room open, when a finding at or above `min_severity` opens or a watched state (dead, hung,
stalled, exited) begins, and once more when it is resolved.

Dedupe: one alert per identity until it clears. A finding's identity is its ident; a state's is
its name in capitals, which is also the identity of the finding it comes with (the `dead` state
and the DEAD finding of attempt 1 are one alert, worded by the finding). An identity is open
while any of its sources (the findings, the state) is; its `resolved` goes out when the last one
closes.

What one loop callback raises is gathered and sent once that callback is done (`call_soon`), so a
state change and the finding raised beside it merge, and something raised and cleared within the
same evaluation is never sent at all. Delivery runs in the channels' worker threads
(dispatch.py); their results come back as NotifyResult records through the keeper's `emit`, on
its loop.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec

from trainroom.core.configuration import sections
from trainroom.core.findings import SEVERITY_RANK
from trainroom.core.notify import alert as alerts
from trainroom.core.notify.alert import Alert
from trainroom.core.notify.channels import Channel, channels_from
from trainroom.core.notify.dispatch import Dispatcher
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

CLOSE_S = 10.0  # how long a closing keeper waits for queued alerts to go out
Reply = Callable[[p.Reply], None]


class Sink(Protocol):
    """Where results go: the keeper's Recorder (structurally)."""

    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...


class Alerts:
    """Observes the keeper's records (loop thread only) and hands alerts to the dispatcher."""

    def __init__(
        self,
        policy: sections.Notify,
        channels: list[Channel],
        unavailable: list[tuple[str, str]],
        *,
        sink: Sink,
        state: Callable[[], RunState],
    ) -> None:
        self.policy = policy
        self.host = socket.gethostname()
        self._sink = sink
        self._state = state
        self._unavailable = unavailable
        self._dispatcher = Dispatcher(channels, policy, self._report)
        self._threshold = SEVERITY_RANK[policy.min_severity]
        self._sources: dict[str, set[str]] = {}  # open identity -> {"state", "finding <ident>"}
        self._finding_alert: dict[str, str] = {}  # open finding's ident -> its alert's identity
        self._sent: dict[str, Alert] = {}  # identities alerted and not yet resolved
        self._pending: dict[str, Alert] = {}  # to send when this loop callback is done
        self._pending_resolved: list[Alert] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._closed = False

    @classmethod
    def for_run(
        cls,
        policy: sections.Notify,
        *,
        cwd: str,
        sink: Sink,
        state: Callable[[], RunState],
        env: Mapping[str, str] | None = None,
    ) -> Alerts:
        """The keeper's alerts: the channels [notify] and the launch flags name (settings.notify)."""
        channels, unavailable = channels_from(policy, cwd=cwd, env=os.environ if env is None else env)
        return cls(policy, channels, unavailable, sink=sink, state=state)

    # ------------------------------------------------------------------ observing (loop thread)

    def observe(self, rec: p.Record) -> None:
        if isinstance(rec, p.FindingRaised):
            self._finding(rec)
        elif isinstance(rec, p.FindingCleared):
            ident = self._finding_alert.pop(rec.ident, None)
            if ident is not None:
                self._close(ident, f"finding {rec.ident}", rec.t)
        elif isinstance(rec, p.RunStatus):
            self._status(rec)
        elif isinstance(rec, p.KeeperStarted):
            for name, why in self._unavailable:
                self._later(p.NotifyResult(t=rec.t, channel=name, outcome="unavailable", detail=why))

    def _finding(self, rec: p.FindingRaised) -> None:
        f = rec.finding
        ident = alerts.alert_ident(f)
        if SEVERITY_RANK.get(f.severity, 0) < self._threshold and f.ident not in self._finding_alert:
            return
        self._finding_alert[f.ident] = ident
        source = f"finding {f.ident}"
        if ident in self._sent:  # open and told: a refresh of its figures, or a second source
            self._sources.setdefault(ident, set()).add(source)
            return
        st = self._state()
        made = alerts.from_finding(
            f,
            run=st.run_id,
            host=self.host,
            t=f.last_seen or time.time(),
            state=st.status,
            step=st.current_step(),
        )
        pending = self._pending.get(ident)
        if pending is not None and self._sources.get(ident) == {"state"}:
            # The state's alert, not sent yet: worded by the finding raised beside it.
            self._pending[ident] = msgspec.structs.replace(
                pending, message=made.message, evidence=made.evidence, action=made.action or pending.action
            )
        self._open(ident, source, made)

    def _status(self, rec: p.RunStatus) -> None:
        ident = alerts.state_ident(rec.state)
        for other in [i for i, src in self._sources.items() if "state" in src and i != ident]:
            self._close(other, "state", rec.t)
        if rec.state not in self.policy.states:
            return
        st = self._state()
        a = st.attempt
        made = alerts.from_state(
            rec.state,
            rec.reason,
            run=st.run_id,
            host=self.host,
            t=rec.t,
            attempt=a.n if a else None,
            step=st.current_step(),
        )
        self._open(ident, "state", made)

    def _open(self, ident: str, source: str, made: Alert) -> None:
        sources = self._sources.setdefault(ident, set())
        sources.add(source)
        if ident not in self._sent and ident not in self._pending:
            self._pending[ident] = made
            self._schedule()

    def _close(self, ident: str, source: str, t: float) -> None:
        sources = self._sources.get(ident)
        if sources is None:
            return
        sources.discard(source)
        if sources:
            return
        del self._sources[ident]
        if self._pending.pop(ident, None) is not None:
            return  # opened and closed within one evaluation: nobody needs to hear of it
        sent = self._sent.pop(ident, None)
        if sent is not None:
            st = self._state()
            self._pending_resolved.append(alerts.resolved(sent, t=t, state=st.status, step=st.current_step()))
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        resolved, self._pending_resolved = self._pending_resolved, []
        pending, self._pending = self._pending, {}
        for a in resolved:
            self._dispatcher.submit(a)
        for ident, a in pending.items():
            self._sent[ident] = a
            self._dispatcher.submit(a)

    # ------------------------------------------------------------------ results (any thread)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _later(self, rec: p.NotifyResult) -> None:
        """Emit on the loop, after the record being observed (never inside its emit)."""
        self._running_loop().call_soon(self._sink.emit, rec)

    def _report(self, rec: p.NotifyResult) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or self._closed:
            return  # a result after the keeper closed its journal has nowhere to go
        try:
            loop.call_soon_threadsafe(self._sink.emit, rec)
        except RuntimeError:
            pass  # the loop closed between the check and the call: the keeper is gone

    # ------------------------------------------------------------------ the test action

    async def test_action(self, req: p.Request, reply: Reply) -> None:
        """`trainroom notify --test RUN`: one try through each channel, past the rate limit and
        the dedupe; the reply lists each channel's result (journaled too, as NotifyResults)."""
        self._running_loop()
        results: list[dict[str, Any]] = [
            {"channel": name, "outcome": "unavailable", "detail": why, "latency_s": None}
            for name, why in self._unavailable
        ]
        if not self._dispatcher.workers and not results:
            reply(_done(req, False, "no alert channels configured: see [notify] in the README", results))
            return
        st = self._state()
        test = alerts.test_alert(run=st.run_id, host=self.host, t=time.time(), state=st.status)
        for fut in self._dispatcher.test(test):
            r = await asyncio.wrap_future(fut)
            results.append(
                {"channel": r.channel, "outcome": r.outcome, "detail": r.detail, "latency_s": r.latency_s}
            )
        ok = all(r["outcome"] == "delivered" for r in results)
        delivered = sum(r["outcome"] == "delivered" for r in results)
        reply(_done(req, ok, f"test alert delivered through {delivered} of {len(results)} channels", results))

    async def close(self) -> None:
        """Let queued alerts (the run's last state, say) go out before the keeper exits."""
        if self._pending or self._pending_resolved:
            self._dispatch()
        await asyncio.to_thread(self._dispatcher.close, CLOSE_S)
        await asyncio.sleep(0)  # the results the workers posted before they ended
        self._closed = True


def _done(req: p.Request, ok: bool, message: str, results: list[dict[str, Any]]) -> p.Reply:
    return p.Reply(
        id=req.id, action=req.action, stage="done", ok=ok, message=message, after={"results": results}
    )
