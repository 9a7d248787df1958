"""The keeper's loops: the tick (read the log, judge, serve, flush, check the linger) every TICK_S
and the host probe every PROBE_S, both slowed while it rests (keeper.rest)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from trainroom.core.health.statedisk import observe as observe_state_disk
from trainroom.core.keeper.attempts import Attempts
from trainroom.core.keeper.rest import AWAKE_NOTE, REST_NOTE, Quiet, linger_verdict, rest_wait, why_awake
from trainroom.core.samples import HostSample
from trainroom.core.wire import protocol as p

TICK_S = 0.1  # watchdog cadence: DEAD is raised by the child's exit, the rest within a tick
PROBE_S = 1.0


class Ticking(Attempts):
    """The tick and probe loops, and when the keeper may rest or exit."""

    async def tick_loop(self) -> None:
        while not self.stop_event.is_set():
            now = time.time()
            self._tick(now)
            if self.stop_event.is_set():
                return
            # Guarded like the tick: a rest decision that raises is a fault, never the loop's end.
            failed: str | None = "the rest check failed"
            why = self.supervision.guard.call("keeper.rest", self._awake_why, failed)
            if why is None:
                await self._rest(now)
                continue
            if not self.active.is_set():
                self.active.set()
                self.note(AWAKE_NOTE + why)
            await asyncio.sleep(TICK_S)

    def quiet(self) -> Quiet:
        pipe, a = self.pipeline, self.state.attempt
        return Quiet(
            trainer=self.trainer_alive() or (a is not None and a.alive),
            ending=self._ending is not None and not self._ending.done(),
            acting=self.actions.busy,
            verifying=bool(pipe.in_flight()) or pipe.settling(),
        )

    def _awake_why(self) -> str | None:
        """None: the keeper may rest (keeper.rest); else why it may not, in words."""
        a, codes = self.state.attempt, [f.code for f in self.state.findings.values()]
        ended = a.ended_at if a is not None else None
        return why_awake(self.quiet(), ended, self.state.probe, codes, self.pipeline.settled_at)

    async def _rest(self, now: float) -> None:
        """A tick after each slow probe, or sooner when something can change the run, or when
        the linger is over."""
        rest_s = self._settings.rest_probe_s
        if self.active.is_set():
            self.active.clear()
            self.emit(p.KeeperNote(t=now, message=REST_NOTE.format(rest=rest_s, linger=self._linger_s())))
            g = self.supervision.guard
            g.call("server.flush", self.server.flush, None)
            g.call("journal.flush", self.flush, None)
            # `runs` and the picker read the ended run at once.
            g.call("journal.summary", self.journal.write_summary, None)
        self.wake.clear()
        viewers, others = self.server.has_viewers(), self.server.has_clients()
        timeout = rest_wait(rest_s, self._linger_s(), self.idle_since, now, viewers=viewers, others=others)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def _tick(self, now: float) -> None:
        """Each step guarded on its own: nothing that raises may end the loop that sees deaths."""
        g = self.supervision.guard
        g.call("keeper.read_log", lambda: self._read_log(now), None)
        g.call("keeper.evaluate", lambda: self.evaluate(now), None)
        g.call("server.tick", lambda: self.server.tick(now), None)
        g.call("server.flush", self.server.flush, None)
        g.call("journal.flush", self.flush, None)
        g.call("keeper.linger", lambda: self._check_linger(now), None)

    async def probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            try:
                targets = self.supervision.targets()
                sample = await loop.run_in_executor(None, self._probe, targets)
            except Exception as exc:  # a probe must never take the keeper down
                now = time.time()
                why = f"host probe failed: {type(exc).__name__}: {exc}"
                sample = p.ProbeSample(t=now, host=HostSample(t=now, available=False, reason=why))
            self.emit(sample, journal=False)
            # Re-arm only after the previous probe ended, so probes never overlap; a resting
            # keeper probes every rest_probe_s, and at once when it stops resting.
            resting = not self.active.is_set()
            left = max(0.05, (self._settings.rest_probe_s if resting else PROBE_S) - (time.monotonic() - t0))
            if not resting:
                await asyncio.sleep(left)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.active.wait(), left)

    def _probe(self, targets: object) -> p.ProbeSample:
        """One probe cycle (worker thread): the sweep, then the checkpoint disk."""
        from trainroom.core.probes.sweep import ProbeTargets

        assert isinstance(targets, ProbeTargets)
        sample = self.supervision.probe(targets)
        sample.disk = self.pipeline.disk_sample()
        budget = bool(self._settings.disk_budget_bytes)
        try:
            self.state_disk = observe_state_disk(
                self._run_dir, self.journal.usage(), self._settings.ckpt_root, budget, self.output.loss
            )
        except OSError:
            self.state_disk = None
        return sample

    def _linger_s(self) -> float:
        """A run whose trainer died waits longer for its resume (resting, it costs little)."""
        return self._settings.dead_linger_s if self.state.status == "dead" else self._settings.linger_s

    def _check_linger(self, now: float) -> None:
        if not self.quiet().idle or self.server.has_viewers():
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        why = linger_verdict(self, now)
        if why is not None:
            self.emit(p.KeeperNote(t=now, message=why))
            self.stop_event.set()
