"""Taking up a run whose keeper died: a new keeper on the same run (same id, same journal).

`trainroom resume RUN` (its trainer gone) and `trainroom attach PID` (its trainer still running,
an orphan) start a keeper on a run that already has a journal. That keeper goes on from the
journal's fold instead of starting an attempt: the last attempt's process, when it still runs
(by pid and start tick), is taken back and watched through a pidfd (keeper.adopt: the new keeper
is not its parent, so its exit status will not be known); when it no longer runs, its end is
recorded as one nobody watched. A resume then starts the next attempt under this keeper.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from trainroom.core.keeper.adopt import Adopted, AdoptHost, watch
from trainroom.core.probes.adopt import Adoptee, still_runs
from trainroom.core.run import store as runs
from trainroom.core.run.parts import AttemptView
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p

UNWATCHED = "ended while no keeper watched it: exit status unknown"


def prior_view(run_dir: Path, rec: runs.RunRecord) -> RunView | None:
    """The run as its journal says, when a keeper takes up a run that had attempts; else None."""
    if not (run_dir / runs.JOURNAL_NAME).exists():
        return None
    view = runs.load_view(run_dir)
    return view if view.state.attempts else None


def take_up(host: AdoptHost, a: AttemptView) -> asyncio.Task[None] | None:
    """Go on with the journal's last attempt: take its process back, or record its end."""
    host.attempt_n = a.n
    if a.ended_at is not None:
        host.note(
            f"a new keeper takes up the run: attempt {a.n} had ended; `trainroom resume` starts the next"
        )
        return None
    if a.pid > 0 and still_runs(a.pid, a.start_time, a.start_ticks):
        handle = Adopted(a.pid)
        host.adopt_child(handle)
        host.note(
            f"taken back: attempt {a.n} (pid {a.pid}) runs on under a new keeper, which is not its parent: "
            "its exit status will not be known",
            "warning",
        )
        orphan = Adoptee(
            pid=a.pid,
            start_time=a.start_time,
            start_ticks=a.start_ticks,
            pgid=a.pgid,
            argv=list(a.argv),
            cwd=a.cwd,
            env={},
            log=None,
            log_why="its keeper's trainer.log",
            ckpt_dir=None,
        )
        return asyncio.get_running_loop().create_task(watch(host, a.n, handle, orphan))
    host.emit(p.AttemptEnded(n=a.n, t=time.time(), error=UNWATCHED))
    host.note(
        f"a new keeper takes up the run: attempt {a.n} (pid {a.pid}) no longer runs; its end was not seen"
    )
    return None
