"""The keeper's attempts: each one's environment and start (its child in a new process group),
the wait on it, and its end judged once its last output is read."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import psutil

from trainroom.core.configuration import settings as settings_mod
from trainroom.core.keeper import adopt
from trainroom.core.keeper.output import log_line
from trainroom.core.keeper.verdicts import Verdicts
from trainroom.core.keeper.workers import crash_rank, log_rank
from trainroom.core.probes import procs
from trainroom.core.sdk.lr import requested_from_argv
from trainroom.core.wire import protocol as p

FLOOR_WAIT_S = 5.0  # the longest an attempt's start waits to read the devices' memory floor


class Attempts(Verdicts):
    """Starting, waiting on and judging the trainer's attempts (RunContext.start_attempt)."""

    def _attempt_env(self, n: int, resume_from: str | None) -> dict[str, str]:
        env = adopt.base_env(self.record)  # an attached run's takeover: its own environment
        env.update(
            {
                "TRAINROOM_SOCKET": str(self.sock_path),
                "TRAINROOM_RUN": self.record.run_id,
                "TRAINROOM_RUN_DIR": str(self._run_dir),
                "TRAINROOM_ATTEMPT": str(n),
                "PYTHONUNBUFFERED": "1",
                # The one root the trainer's SDK, prune and resume all see.
                settings_mod.ENV_CKPT_ROOT: self._settings.ckpt_root,
            }
        )
        if self._settings.disk_budget_bytes:
            # The SDK's pre-save check refuses a checkpoint the budget cannot take.
            env["TRAINROOM_DISK_BUDGET"] = str(self._settings.disk_budget_bytes)
        if resume_from:
            env["TRAINROOM_RESUME"] = resume_from
        else:
            env.pop("TRAINROOM_RESUME", None)
        return env

    async def start_attempt(
        self, argv: list[str] | None = None, resume_from: str | None = None, resume_step: int | None = None
    ) -> p.AttemptStarted | p.AttemptEnded:
        self.attempt_n += 1
        n = self.attempt_n
        argv = argv or list(self.record.argv)
        env = self._attempt_env(n, resume_from)
        # The devices' memory with nothing of this attempt on it: where the driver gives no
        # per-process memory, a kill judges the release against it (sample() never raises; a
        # wedged driver call must not hold the launch, so it gets a few seconds).
        try:
            floor = await asyncio.wait_for(asyncio.to_thread(self.supervision.gpu.floor), FLOOR_WAIT_S)
        except TimeoutError:
            floor = None
        now = time.time()
        out = await self.output.open(n)
        with self.output.log_file() as log:
            log_line(log, f"attempt {n} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}")
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log if out is None else out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.record.cwd,
                    env=env,
                    process_group=0,
                )
            except OSError as exc:
                log_line(log, f"could not start: {exc}")
                return self._could_not_start(n, now, argv, resume_from, exc)
            finally:
                if out is not None:
                    os.close(out)  # the trainer holds it now: the pipe ends when the trainer's side does
        try:
            start_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            start_time = now
        self.proc = proc
        started = p.AttemptStarted(
            n=n,
            t=now,
            pid=proc.pid,
            pgid=proc.pid,
            start_time=start_time,
            start_ticks=procs.start_ticks(proc.pid),
            argv=argv,
            cwd=self.record.cwd,
            resume_from=resume_from,
            resume_step=resume_step,
            requested=requested_from_argv(argv),
            vram_floor=floor,
        )
        self.emit(started)
        self.flush()
        self._ending = asyncio.get_running_loop().create_task(self._wait_attempt(n, proc))
        return started

    def _could_not_start(
        self, n: int, now: float, argv: list[str], resume_from: str | None, exc: OSError
    ) -> p.AttemptEnded:
        started = p.AttemptStarted(
            n=n, t=now, pid=0, pgid=0, start_time=0.0, argv=argv, cwd=self.record.cwd, resume_from=resume_from
        )
        self.emit(started)
        ended = p.AttemptEnded(n=n, t=time.time(), exit_code=127, error=f"could not start: {exc}")
        self.emit(ended)
        self.flush()
        return ended

    async def _wait_attempt(self, n: int, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        await self.attempt_over(
            n,
            proc,
            lambda t: p.AttemptEnded(
                n=n, t=t, exit_code=rc if rc >= 0 else None, exit_signal=-rc if rc < 0 else None
            ),
        )

    async def attempt_over(self, n: int, proc: object, ended_of: Callable[[float], p.AttemptEnded]) -> None:
        """An attempt's process has ended (waited for, or an adopted one's pidfd): judge it."""
        now = time.time()
        await self.output.drained(n)  # the last lines (a traceback) are in trainer.log
        g = self.supervision.guard
        # Read what the trainer wrote last before calling it: a traceback there is the cause.
        g.call("keeper.read_log", lambda: self._read_log(now, final=True), None)
        ended = ended_of(now)
        self.emit(ended)
        a = self.state.attempt
        if a is not None and a.n == n and ended.exit_code != 0 and a.crash is None:
            lines = self.tail.cause_lines(a.last_step_t)  # a traceback before the last step is not it
            crash = g.call(
                "log reader.crash", lambda: self.supervision.crash_from_log("\n".join(lines)), None
            )
            if crash is not None:
                self.emit(p.Received(attempt=n, rank=crash_rank(self.state, lines, now), t=now, msg=crash))
        self.flush(fsync=True)
        if self.proc is proc:
            self.proc = None
        g.call("keeper.evaluate", lambda: self.evaluate(now), None)
        g.call("server.flush", self.server.flush, None)
        if self.auto_resume is not None:
            await self.auto_resume.attempt_ended(ended)

    def _read_log(self, now: float, final: bool = False) -> None:
        a = self.state.attempt
        rank = log_rank(self.state, now)
        if rank is None and not final and a is not None and not a.instrumented:
            return  # a launcher's ranks not found yet: its lines are read once they are
        n, exact = (a.n, a.instrumented) if a is not None else (None, False)
        no: list[p.Record] = []
        recs = self.supervision.guard.call(
            "log reader", lambda: self.tail.collect(now, n, exact, rank or 0, final), no
        )
        for rec in recs:
            self.emit(rec)
