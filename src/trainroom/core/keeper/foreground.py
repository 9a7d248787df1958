"""The keeper of a foreground run (`launch --foreground`, or any launch inside a Slurm step): it
lives exactly as long as the trainer, so Slurm's accounting, signals and cleanup stay right.

- SIGTERM or SIGINT (scancel, a time limit, srun's Ctrl-C, `launch` forwarding one) is journaled
  with what Slurm says of the job (CANCELLED, TIMEOUT, ...), then the trainer's process group is
  stopped through the kill action's plan (SIGTERM, a grace below Slurm's KillWait, SIGKILL),
  journaled like every kill, as client `slurm`.
- Once the trainer has ended and nothing of the run is moving (no kill, verification or save in
  flight), the keeper exits: `launch` is waiting on it and exits with the trainer's status.

A detached keeper keeps its old behaviour: SIGTERM and SIGINT end the keeper only.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from trainroom.core.ckpt.layout import VerifiedCheckpoint, verified_checkpoints
from trainroom.core.configuration.settings import LaunchOptions, RunSettings
from trainroom.core.keeper.actions import Actions
from trainroom.core.keeper.rest import Quiet
from trainroom.core.keeper.timeleft import TimeLeftWatch
from trainroom.core.run.ended import attempt_ended
from trainroom.core.run.state import RunState
from trainroom.core.sdk.requests import REQUEST_NAME, current_request, write_request
from trainroom.core.slurm.place import SlurmPlace
from trainroom.core.slurm.scontrol import SlurmError, SlurmReader
from trainroom.core.wire import protocol as p

# Between the kill plan's SIGTERM and SIGKILL: below Slurm's KillWait (30 s by default), which
# SIGKILLs the whole step after it, keeper included.
SLURM_GRACE_S = 3.0
POLL_S = 0.2
REASON_WAIT_S = 3.0
# How long a checkpoint asked for by the job's warning signal may take to be written and verified.
CKPT_WAIT_S = 600.0
_REQUEST_ID = 1 << 30


class ForegroundKeeper(Protocol):
    """What this part needs of the keeper."""

    stop_event: asyncio.Event
    actions: Actions

    @property
    def state(self) -> RunState: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def settings(self) -> RunSettings: ...

    def quiet(self) -> Quiet: ...

    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...

    def flush(self, *, fsync: bool = False) -> None: ...


def slurm_words(place: SlurmPlace | None, reader: SlurmReader | None = None) -> str:
    """What Slurm says of the job at a signal, in words (one scontrol query, bounded)."""
    if place is None:
        return "from outside the run (no Slurm job)"
    try:
        job = (reader or SlurmReader()).job(place.job_id)
    except SlurmError as exc:
        return f"Slurm job {place.job_id}; scontrol did not say why: {exc}"
    if job is None:
        return f"Slurm job {place.job_id}, which slurmctld no longer knows"
    limit, ran = job.time_limit_s, job.run_time_s
    if job.state == "COMPLETING" and limit is not None and ran is not None and ran >= limit - 1:
        return f"Slurm job {place.job_id} is COMPLETING: its time limit ({limit:.0f} s) was reached"
    why = {
        # slurmctld shows an ending job as COMPLETING (the final state comes once every step ended)
        "COMPLETING": "ending: cancelled (scancel), or its batch script ended",
        "CANCELLED": "cancelled (scancel)",
        "TIMEOUT": "its time limit was reached",
        "PREEMPTED": "preempted",
        "NODE_FAIL": "a node failed",
        "RUNNING": "still RUNNING: a signal sent with scancel -s, by srun, or a warning signal",
    }.get(job.state, job.state)
    reason = f", reason {job.reason}" if job.reason else ""
    return f"Slurm job {place.job_id} is {job.state}: {why}{reason}"


def request_written(run_dir: str | Path) -> float:
    """When the current checkpoint request was written (its file's time, the kernel's clock, as
    a checkpoint file's); now when it cannot be read."""
    try:
        return (Path(run_dir) / REQUEST_NAME).stat().st_mtime
    except OSError:
        return time.time()


def newest_verified(
    root: str | Path, *, since: float | None = None, until: float | None = None
) -> VerifiedCheckpoint | None:
    """The newest promoted checkpoint (by step, then write time) its trainer wrote at or after
    `since`, or before `until`."""
    found = [
        v
        for v in verified_checkpoints(root)
        if (since is None or v.saved_at >= since) and (until is None or v.saved_at < until)
    ]
    return max(found, key=lambda v: (v.step, v.saved_at)) if found else None


class Foreground:
    def __init__(self, keeper: ForegroundKeeper, options: LaunchOptions) -> None:
        self.keeper, self.options = keeper, options
        self.stopping: str | None = None
        self.client = "slurm" if options.slurm is not None else "signal"  # who the kill is journaled as
        self._tasks: list[asyncio.Task[None]] = []
        # The attempts a checkpoint-then-requeue was asked for in (once each), and why, by request.
        self.asked: set[int] = set()
        self.reasons: dict[str, str] = {}

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self.options.foreground:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.keeper.stop_event.set)
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig)
        self._tasks.append(loop.create_task(self._exit_when_done()))
        place, policy = self.options.slurm, self.keeper.settings.slurm
        if place is not None and place.procid == 0 and policy.time_left_trigger:
            watch = TimeLeftWatch(self.keeper, place, policy, self.ask_before_time_limit)
            self._tasks.append(loop.create_task(watch.run()))

    def ask_before_time_limit(self, attempt: int, why: str) -> bool:
        """The job's time left is short (keeper/timeleft.py): ask what its warning signal asks for."""
        if attempt in self.asked:
            return False
        request = f"time-left-{time.time():.3f}"
        self.reasons[request] = why
        write_request(self.keeper.run_dir, request)  # the trainer reads it; _exit_when_done follows it
        return True

    def _signalled(self, sig: signal.Signals) -> None:
        if self.stopping is not None:
            return  # one stop at a time (Slurm signals the keeper and `launch` forwards the same)
        self.stopping = sig.name
        a, now = self.keeper.state.attempt, time.time()
        if a is not None and a.alive:
            # Slurm signals every process of the step at once: the trainer may end of this very
            # signal before the kill plan is made. Either way it was stopped, not a death.
            until = now + (SLURM_GRACE_S if self.options.slurm is not None else 10.0) + 15.0
            self.keeper.emit(p.AttemptStopping(n=a.n, t=now, by=self.client, until=until))
            self.keeper.flush(fsync=True)
        self._tasks.append(asyncio.get_running_loop().create_task(self._stop_trainer(sig)))

    async def _stop_trainer(self, sig: signal.Signals) -> None:
        k = self.keeper
        try:
            words = await asyncio.wait_for(
                asyncio.to_thread(slurm_words, self.options.slurm), REASON_WAIT_S + 2.0
            )
        except TimeoutError:
            words = "Slurm did not answer in time"
        k.emit(
            p.KeeperNote(
                t=time.time(),
                message=f"{sig.name} received ({words}): stopping the trainer through the kill plan",
                kind="warning",
            )
        )
        k.flush(fsync=True)
        a = k.state.attempt
        if a is None or not a.alive:
            k.stop_event.set()
            return
        grace = SLURM_GRACE_S if self.options.slurm is not None else None
        args = {"grace_s": grace} if grace is not None else {}
        replies: list[p.Reply] = []
        await k.actions.serve(
            p.Request(id=_REQUEST_ID, action="kill", args=args), replies.append, self.client
        )
        plan = replies[-1].plan if replies else None
        if not replies or replies[-1].stage != "plan" or plan is None:
            return  # refused (journaled); the trainer got Slurm's own signal, and KillWait follows
        confirm = p.Request(id=_REQUEST_ID + 1, action="kill", args=p.confirming(args, plan), confirm=True)
        await k.actions.serve(confirm, replies.append, self.client)

    async def _exit_when_done(self) -> None:
        k = self.keeper
        seen = current_request(k.run_dir)
        while not k.stop_event.is_set():
            await asyncio.sleep(POLL_S)
            asked = current_request(k.run_dir)
            if asked is not None and asked != seen:
                seen = asked
                self._tasks.append(
                    asyncio.get_running_loop().create_task(self._checkpoint_then_requeue(asked))
                )
            a = k.state.attempt
            if a is None or a.alive or not k.quiet().idle:
                continue
            how = attempt_ended(a)
            k.emit(
                p.KeeperNote(t=time.time(), message=f"the trainer ended ({how}): the foreground keeper exits")
            )
            k.flush(fsync=True)
            k.stop_event.set()

    async def _checkpoint_then_requeue(self, request: str) -> None:
        """The job's warning signal came (`launch` wrote the request the trainer reads): wait for a
        checkpoint the trainer wrote after the request, verified, then requeue the job (task 0
        only: one requeue per job). None came: say so and leave the job as it is.

        The request's time is its file's, and a checkpoint's is its trainer's write: the trainer
        may answer (and the keeper verify) before this loop notices the request, so what the
        keeper had seen by then is no baseline."""
        k, place = self.keeper, self.options.slurm
        asked_at = request_written(k.run_dir)
        before = newest_verified(k.settings.ckpt_root, until=asked_at)
        last_step = before.step if before is not None else None
        sig = self.options.checkpoint_signal or "USR2"
        why = self.reasons.get(request, f"SIG{sig.upper().removeprefix('SIG')} (the job's warning signal)")
        a = k.state.attempt
        if a is not None and request not in self.reasons and a.n in self.asked:
            k.emit(
                p.KeeperNote(
                    t=time.time(),
                    message=f"{why} (request {request}): a checkpoint and requeue were already asked "
                    f"for in attempt {a.n}",
                )
            )
            return
        if a is not None:
            self.asked.add(a.n)
        k.emit(
            p.KeeperNote(
                t=time.time(),
                message=f"{why}: asked the trainer to checkpoint now "
                f"(request {request}); the last verified checkpoint before it is "
                + (f"step {last_step}" if last_step is not None else "none"),
                kind="warning",
            )
        )
        k.flush(fsync=True)
        if place is None or place.procid != 0:
            return
        deadline = time.monotonic() + CKPT_WAIT_S
        newer, looked = None, None
        while time.monotonic() < deadline and not k.stop_event.is_set():
            journaled = {c.step for c in k.state.checkpoints if c.state == "verified"}
            if journaled != looked:  # the promoted copies are read only when a verdict came
                looked = journaled
                newer = newest_verified(k.settings.ckpt_root, since=asked_at)
                if newer is not None and newer.step in journaled:  # promoted, its verdict journaled
                    break
                newer = None
            await asyncio.sleep(0.5)
        if newer is None:
            k.emit(
                p.KeeperNote(
                    t=time.time(),
                    message="no checkpoint written since the request was verified (the last verified "
                    "before it: " + (f"step {last_step}" if last_step is not None else "none") + "): "
                    f"Slurm job {place.job_id} is not requeued "
                    f"(`trainroom job slurm:{place.job_id} --resume` requeues it from the last verified step)",
                    kind="warning",
                )
            )
            return
        argv = ["scontrol", "requeue", place.job_id]
        try:
            out = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=30)
            said = (out.stderr or out.stdout).strip()
            ok = out.returncode == 0
        except (OSError, subprocess.TimeoutExpired) as exc:
            said, ok = str(exc), False
        k.emit(
            p.KeeperNote(
                t=time.time(),
                message=f"checkpoint at step {newer.step} verified ({Path(newer.dir) / newer.file}): "
                + (
                    f"Slurm job {place.job_id} requeued; its next attempt resumes from it"
                    if ok
                    else f"`scontrol requeue {place.job_id}` failed: {said or 'no output'}"
                ),
                kind="info" if ok else "warning",
            )
        )
        k.flush(fsync=True)
