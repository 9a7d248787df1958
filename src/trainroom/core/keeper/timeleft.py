"""Task 0's keeper of a Slurm job watches the job's time left, and when it falls below the run's
checkpoint time plus a margin ([slurm] in trainroom.toml) asks for what the job's warning signal
asks for: a checkpoint now, verified, then `scontrol requeue` (keeper/foreground.py does that part
for both). Once per attempt; the reason is journaled in words ("time left 2m10s < checkpoint time
40 s + margin 1m00s").

Its costs: a look at the run's state every POLL_S (the trainer's `checkpoint-save` phase and the
verdicts, to measure the checkpoint time), and one `scontrol show job` per `time_left_every_s`
(none where SLURM_JOB_END_TIME says the end)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from trainroom.core.configuration import config as cfg
from trainroom.core.run.state import RunState
from trainroom.core.slurm import timeleft as tl
from trainroom.core.slurm.place import SlurmPlace
from trainroom.core.slurm.scontrol import SlurmError, SlurmReader
from trainroom.core.wire import protocol as p

POLL_S = 0.5
MAX_MEASURED = 16


class TimeLeftHost(Protocol):
    """What this part needs of the keeper and its foreground part."""

    stop_event: asyncio.Event

    @property
    def state(self) -> RunState: ...

    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...


class SaveClock:
    """How long the run's checkpoints take, measured from what the keeper's state shows: the start
    of each save (a rank's `checkpoint-save` phase, the time the trainer said it began) to the
    checkpoint's verdict (verified)."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self.starts: list[float] = []
        self.measured: list[float] = []
        self._seen: set[str] | None = None

    def observe(self, state: RunState) -> None:
        if self._seen is None:
            # What was verified before this keeper looked (a journal replayed) has no save start
            # it saw: not measured.
            self._seen = {c.path for c in state.checkpoints if c.state == "verified"}
        for rank in state.ranks.values():
            since = rank.phase_since if rank.phase == "checkpoint-save" else None
            if since is not None and (not self.starts or since > self.starts[-1]):
                self.starts.append(since)
                del self.starts[:-MAX_MEASURED]
        for c in state.checkpoints:
            if c.state != "verified" or c.path in self._seen:
                continue
            self._seen.add(c.path)
            start = max((s for s in self.starts if s <= c.t), default=None)
            verify = c.report.seconds if c.report is not None else 0.0
            self.measured.append(tl.save_seconds(start, c.t, verify, self.poll_s))
            del self.measured[:-MAX_MEASURED]
            if start is not None:
                self.starts = [s for s in self.starts if s > start]

    def seconds(self) -> float | None:
        return tl.checkpoint_time_s(self.measured)


class TimeLeftWatch:
    def __init__(
        self,
        host: TimeLeftHost,
        place: SlurmPlace,
        policy: cfg.Slurm,
        ask: Callable[[int, str], bool],
        *,
        reader: SlurmReader | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`ask(attempt, why)`: request the checkpoint and the requeue for attempt `attempt`
        (False when one was already asked for in it, by the warning signal or by this watch)."""
        self.host, self.place, self.policy, self.ask = host, place, policy, ask
        self.reader = reader or SlurmReader(min_interval_s=policy.time_left_every_s)
        self.env = os.environ if env is None else env
        self.clock = SaveClock()
        self._left: tuple[float | None, float] | None = None  # (time left, when: monotonic)
        self._asked_at = float("-inf")
        self._failed_once = False
        self._fired: set[int] = set()

    async def _time_left(self) -> float | None:
        by_env = tl.left_from_env(self.env, time.time())
        if by_env is not None:
            return by_env
        now = time.monotonic()
        if self._left is None or now - self._asked_at >= self.policy.time_left_every_s:
            self._asked_at = now
            try:
                info = await asyncio.to_thread(self.reader.job, self.place.job_id)
                self._left = (info.time_left_s if info is not None else None, time.monotonic())
            except SlurmError as exc:
                if not self._failed_once:
                    self._failed_once = True
                    self.host.emit(
                        p.KeeperNote(
                            t=time.time(),
                            message=f"the time left of Slurm job {self.place.job_id} is unknown for now "
                            f"(scontrol: {exc}); asked again every {self.policy.time_left_every_s:.0f} s",
                            kind="warning",
                        )
                    )
        if self._left is None:
            return None
        return tl.left_counted_down(self._left[0], self._left[1], now)

    async def run(self) -> None:
        while not self.host.stop_event.is_set():
            await asyncio.sleep(POLL_S)
            state = self.host.state
            self.clock.observe(state)
            a = state.attempt
            if a is None or not a.alive or a.n in self._fired:
                continue
            left = await self._time_left()
            why = tl.decide(left, self.clock.seconds(), self.policy.checkpoint_time_s, self.policy.margin_s)
            if why is None:
                continue
            self._fired.add(a.n)
            if not self.ask(a.n, why):
                self.host.emit(
                    p.KeeperNote(
                        t=time.time(),
                        message=f"{why}: a checkpoint and requeue were already asked for in attempt {a.n} "
                        "(by the job's warning signal)",
                    )
                )
