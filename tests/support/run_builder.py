"""Builds a RunState the way the keeper does: by applying protocol records, on a fake clock."""

from __future__ import annotations

import random
from typing import Any

from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p


class RunBuilder:
    """A run, a clock, and helpers that apply the records a keeper would journal."""

    def __init__(self, t0: float = 1_000_000.0) -> None:
        self.now = t0
        self.run = RunState(run_id="r-test", argv=["python", "train.py"], cwd="/tmp", created=t0)
        self.attempt = 0
        self.step = 0
        self.pid = 0

    def apply(self, rec: Any) -> None:
        self.run.apply(rec)

    def start(self, pid: int = 4242, instrumented: bool = True, first_step: int = 0) -> None:
        self.attempt += 1
        self.pid = pid
        self.step = first_step
        self.apply(
            p.AttemptStarted(
                n=self.attempt,
                t=self.now,
                pid=pid,
                pgid=pid,
                start_time=self.now,
                argv=["python", "train.py"],
                cwd="/tmp",
            )
        )
        if instrumented:
            self.rx(p.Hello(pid=pid))

    def rx(self, msg: Any, rank: int = 0) -> None:
        self.apply(p.Received(attempt=self.attempt, rank=rank, t=self.now, msg=msg))

    def do_step(self, reserved: int | None = None, source: str = "reporter", rank: int = 0) -> None:
        self.step += 1
        self.rx(
            p.Step(
                step=self.step,
                t=self.now,
                loss=2.0,
                alloc_allocated=reserved,
                alloc_reserved=reserved,
                alloc_peak=reserved,
                source=source,
            ),
            rank=rank,
        )  # type: ignore[arg-type]

    def beat(self, phase: str = "train", main_frame_age: float | None = 0.0, rank: int = 0) -> None:
        self.rx(
            p.Heartbeat(
                t=self.now, phase=phase, main_frame="train.py:10 in main", main_frame_age_s=main_frame_age
            ),
            rank=rank,
        )

    def end(self, exit_code: int | None = None, exit_signal: int | None = None) -> None:
        self.apply(p.AttemptEnded(n=self.attempt, t=self.now, exit_code=exit_code, exit_signal=exit_signal))

    def verified(self, step: int) -> None:
        self.apply(p.CheckpointState(path=f"/ck/step-{step:06d}", step=step, state="verified", t=self.now))

    def steps(
        self,
        n: int,
        interval: float = 0.1,
        jitter: float = 0.0,
        rng: random.Random | None = None,
        beat_every: float = 1.0,
        reserved: int | None = None,
    ) -> None:
        """n steps at `interval` (+- jitter), heartbeats every `beat_every` seconds between them."""
        rng = rng or random.Random(0)
        next_beat = self.now + beat_every
        for _ in range(n):
            dt = interval + (rng.uniform(-jitter, jitter) if jitter else 0.0)
            target = self.now + dt
            while next_beat <= target:
                self.now = next_beat
                self.beat()
                next_beat += beat_every
            self.now = target
            self.do_step(reserved=reserved)
