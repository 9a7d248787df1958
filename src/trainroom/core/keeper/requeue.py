"""A requeued Slurm job is the same run, one attempt later.

When Slurm starts a requeued job again (SLURM_RESTART_COUNT = N > 0), each task's `trainroom
launch` takes up the run its task had (cli/requeue.py: same job, same task) and starts a keeper on
it with `requeue_pending` in the record. That keeper, instead of waiting for a `resume`, starts
the run's next attempt itself, as `trainroom resume` would and journaled as one by client
`slurm`: from the newest verified checkpoint (this run's, or the job's when another task saved
it: every rank resumes from the same step), re-verified before the load, with the resume command
(the resume template, which carries this session's LR policy: `--lr` in it is the LR the attempt
asks for and LR_MISMATCH compares against). The journal says why first: "requeued by Slurm
(restart N)".

No verified checkpoint anywhere: the attempt starts from scratch, and the journal says so. A
resume the death criteria refuse (a process of the old attempt still here, a lock held) is tried
again a few times; still refused, the journal says why and the step ends without a trainer.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Protocol

import msgspec

from trainroom.core.ckpt.layout import read_manifest
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.keeper import takeup
from trainroom.core.keeper.actions import Actions
from trainroom.core.keeper.adopt import AdoptHost
from trainroom.core.keeper.recovery import Resumer
from trainroom.core.ops.resume import WatchedTarget
from trainroom.core.run import store as runs
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

TRIES = 3  # a resume the death criteria refuse is asked again this many times in all
RETRY_S = 5.0
_REQUEST_ID = (1 << 30) + 16
CLIENT = "slurm"


class RequeueKeeper(AdoptHost, Protocol):
    """What this part needs of the keeper."""

    resumer: Resumer
    actions: Actions

    @property
    def state(self) -> RunState: ...

    @property
    def run_dir(self) -> Path: ...

    def flush(self, *, fsync: bool = False) -> None: ...

    async def start_attempt(
        self, argv: list[str] | None = None, resume_from: str | None = None, resume_step: int | None = None
    ) -> p.AttemptStarted | p.AttemptEnded: ...


def pending(options: LaunchOptions) -> bool:
    """This keeper was started to carry a requeued Slurm job's run on (cli/requeue.py)."""
    return options.requeue_pending and options.slurm is not None


def job_best(options: LaunchOptions) -> WatchedTarget | None:
    """The newest verified checkpoint of the job's runs that the requeued launch found (its
    manifest's digest, re-checked before the load)."""
    if not options.resume_from:
        return None
    manifest = read_manifest(Path(options.resume_from).parent)
    digest = (
        manifest.digest if manifest is not None and manifest.file == Path(options.resume_from).name else None
    )
    return WatchedTarget(path=options.resume_from, step=options.resume_step, digest=digest)


def take_up(k: RequeueKeeper) -> asyncio.Task[None] | None:
    """Go on with the journal's last attempt (its end recorded, or its process taken back), then,
    once it has ended, start the next one as the requeue's (a task: the keeper stays while it runs).
    Done once: the record's `requeue_pending` is cleared first."""
    opts = k.record.options
    a = k.state.attempt
    assert a is not None and opts.slurm is not None
    k.record.options = msgspec.structs.replace(opts, requeue_pending=False)
    runs.write_record(k.run_dir, k.record)
    if a.ended_at is not None:
        k.attempt_n = a.n
    else:
        adopted = takeup.take_up(k, a)  # Slurm killed the old step: its end was not journaled
        if adopted is not None:
            k.note(
                f"requeued by Slurm (restart {opts.slurm.restart_count}): attempt {a.n} still runs "
                "(taken back): no new attempt is started",
                "warning",
            )
            return adopted
    return asyncio.get_running_loop().create_task(_requeue(k, opts))


async def _requeue(k: RequeueKeeper, opts: LaunchOptions) -> None:
    assert opts.slurm is not None
    restart, n = opts.slurm.restart_count, k.attempt_n + 1
    why = f"requeued by Slurm (restart {restart})"
    k.resumer.job_best = job_best(opts)
    plan = await k.resumer.plan()
    if plan.checkpoint is None:
        k.note(
            f"{why}: attempt {n} starts from scratch: no verified checkpoint of this run or its job", "resume"
        )
        await k.start_attempt()
        return
    k.note(
        f"{why}: attempt {n} of this run resumes from step {plan.step} ({plan.checkpoint}), "
        "the newest verified checkpoint",
        "resume",
    )
    refused = ""
    for i in range(TRIES):
        if i:
            await asyncio.sleep(RETRY_S)
        replies: list[p.Reply] = []
        await k.actions.serve(p.Request(id=_REQUEST_ID, action="resume"), replies.append, CLIENT)
        last = replies[-1] if replies else None
        if last is not None and last.stage == "plan" and last.plan is not None:
            confirm = p.Request(id=_REQUEST_ID + 1, action="resume", args={"expect": last.plan}, confirm=True)
            await k.actions.serve(confirm, replies.append, CLIENT)
            if replies[-1].stage == "done" and replies[-1].ok:
                return
        refused = replies[-1].message if replies else "no answer"
        a = k.state.attempt
        if a is not None and a.n >= n:
            return  # started after all (a client's own resume meanwhile)
    k.emit(
        p.KeeperNote(
            t=time.time(),
            message=f"{why}: attempt {n} was not started: {refused} (`trainroom resume {k.record.run_id}` "
            "starts it once that is fixed)",
            kind="warning",
        )
    )
    k.flush(fsync=True)
