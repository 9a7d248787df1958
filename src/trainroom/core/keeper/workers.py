"""The attempt's rank processes in the journal: each worker the probes find (WorkerSeen) and how
each one ended (WorkerEnded), so a worker's death is told with its rank and signal before the
launcher's own exit (torchrun exits 1 after it has stopped the other workers).

How a worker ended, best first:
- its zombie's wait status, read the moment its pidfd says it exited (a reader on the keeper's
  loop), before torchrun, its parent, reaps it (torchrun polls every 0.1 s);
- torchrun's own report in trainer.log ("exitcode  : -9 (pid: 767)" under "Root Cause"), read
  once the attempt has ended;
- else it is "gone", how unknown (a probe cycle found it missing).

Runs on the keeper's loop thread: `sync` each tick (from Supervision.evaluate), the pidfd
callbacks from the loop itself; it emits through the Recorder it is given, never inside another
emit.
"""

from __future__ import annotations

import asyncio
import os
import time

from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.probes.procs import PROC, read_stat
from trainroom.core.probes.workers import (
    ExitStatus,
    exit_handle,
    launcher_reports,
    prefixed_rank,
    zombie_exit,
)
from trainroom.core.run.parts import AttemptView, WorkerView
from trainroom.core.run.state import RunState
from trainroom.core.samples import GONE_STATES, Worker
from trainroom.core.vocab import WorkerEndSource
from trainroom.core.wire import protocol as p

LOG_TAIL_BYTES = 256 << 10  # torchrun's summary is the last thing it writes
# A launcher (torchrun) gets this long after its start for a probe cycle to find its ranks before
# its log lines are read anyway (as rank 0's where nothing else says).
RANKS_WAIT_S = 30.0


def _launcher_argv(argv: list[str]) -> bool:
    return bool(argv) and (os.path.basename(argv[0]) == "torchrun" or "torch.distributed.run" in argv[:3])


def log_rank(st: RunState, now: float) -> int | None:
    """The rank an uninstrumented attempt's log lines are filed under: the lowest rank of the
    attempt's workers (on a node whose only worker is rank 1, rank 1), 0 for a single process.
    None while a launcher's ranks are not yet found (read the lines once they are, so that node 1
    of a job never shows a rank 0 that is not there)."""
    a = st.attempt
    if a is None:
        return None
    ranks = sorted(w.rank for w in st.workers.values() if w.attempt == a.n)
    if ranks:
        return ranks[0]
    if _launcher_argv(a.argv) and a.ended_at is None and now - a.started_at < RANKS_WAIT_S:
        return None
    return 0


def crash_rank(st: RunState, lines: list[str], now: float) -> int:
    """The rank a crash's traceback is filed under: the one its `[rankN]:` prefix names (in a run
    with that rank, or under a launcher), else the rank the attempt's log lines go to."""
    found = prefixed_rank(lines[-200:])
    a = st.attempt
    ranks = {w.rank for w in st.workers.values() if a is not None and w.attempt == a.n}
    # Believed only where ranks are: a `[rank3]:` a single process printed invents no rank 3.
    if found is not None and (found in ranks or (a is not None and _launcher_argv(a.argv))):
        return found
    rank = log_rank(st, now)
    return rank if rank is not None else 0


class WorkerWatch:
    def __init__(self, recorder: Recorder, run: RunContext, proc_root: str = PROC) -> None:
        self.recorder = recorder
        self.run = run
        self.proc_root = proc_root
        self._handles: dict[int, int] = {}  # pid -> pidfd registered with the loop
        self._reported = 0  # the attempt whose launcher report has been read
        self._sample_t: float | None = None  # the probe cycle last looked at

    # ------------------------------------------------------------------ each tick

    def sync(self) -> None:
        st = self.run.state
        a = st.attempt
        if a is None:
            return
        procs = st.probe.procs if st.probe is not None else None
        if (
            procs is not None
            and procs.attempt == a.n
            and st.probe is not None
            and st.probe.t != self._sample_t
        ):
            self._sample_t = st.probe.t  # each cycle once, not each tick
            self._from_sample(a, procs.workers, st.probe.t)
        if a.ended_at is not None and self._reported != a.n:
            self._reported = a.n
            self._launcher_report(a)
            for w in list(st.workers.values()):
                if w.alive and w.attempt == a.n and not self._alive(w):
                    self._ended(w, None, "gone", time.time())

    def _from_sample(self, a: AttemptView, found: list[Worker], t: float) -> None:
        st = self.run.state
        for w in found:
            known = st.workers.get(w.pid)
            if known is None or known.start_ticks != w.start_ticks:
                self.recorder.emit(
                    p.WorkerSeen(
                        attempt=a.n,
                        t=t,
                        pid=w.pid,
                        rank=w.rank,
                        start_ticks=w.start_ticks,
                        local_rank=w.local_rank,
                        world_size=w.world_size,
                        pgid=w.pgid,
                        sid=w.sid,
                        restarts_left=w.restarts_left,
                    )
                )
                self._arm(w.pid, w.start_ticks)
                known = st.workers.get(w.pid)
            if known is not None and known.alive and w.state in GONE_STATES:
                self._ended(known, zombie_exit(w.pid, w.start_ticks, self.proc_root), "wait-status", t)
        listed = {w.pid for w in found}
        for known in list(st.workers.values()):
            # Missing from a cycle that ran after it was seen, and not there any more: gone. (After
            # the attempt ended a cycle lists none: a worker torchrun left orphaned is followed.)
            if known.alive and known.pid not in listed and t > known.seen_at and not self._alive(known):
                self._ended(known, None, "gone", t)

    def _alive(self, w: WorkerView) -> bool:
        now = read_stat(w.pid, self.proc_root)
        return now is not None and now.start_ticks == w.start_ticks and now.state not in GONE_STATES

    # ------------------------------------------------------------------ the moment it exits

    def _arm(self, pid: int, start_ticks: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not on the keeper's loop (a test of the rules): the probe cycle still sees it
        self._disarm(pid)
        fd = exit_handle(pid, start_ticks, self.proc_root)
        if fd is None:
            return
        self._handles[pid] = fd
        loop.add_reader(fd, self._exited, pid, start_ticks)

    def _disarm(self, pid: int) -> None:
        fd = self._handles.pop(pid, None)
        if fd is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(fd)
        except RuntimeError:
            pass
        os.close(fd)

    def _exited(self, pid: int, start_ticks: int) -> None:
        t = time.time()
        status = zombie_exit(pid, start_ticks, self.proc_root)  # before torchrun reaps it
        self._disarm(pid)
        w = self.run.state.workers.get(pid)
        if w is not None and w.alive and w.start_ticks == start_ticks:
            self._ended(w, status, "wait-status", t)

    def _ended(self, w: WorkerView, status: ExitStatus | None, source: WorkerEndSource, t: float) -> None:
        self._disarm(w.pid)
        a = self.run.state.attempt
        if status is None and a is not None and w.pid == a.pid and w.attempt == a.n:
            # The process the keeper started (Lightning's rank 0 is it): the keeper reaps it, so
            # its status is the attempt's own, known once the attempt has ended (sync then).
            if a.ended_at is None:
                return
            status, source = ExitStatus(a.exit_code, a.exit_signal), "wait-status"
        self.recorder.emit(
            p.WorkerEnded(
                attempt=w.attempt,
                t=t,
                pid=w.pid,
                rank=w.rank,
                exit_code=status.code if status is not None else None,
                exit_signal=status.signal if status is not None else None,
                source=source if status is not None else "gone",
            )
        )

    # ------------------------------------------------------------------ torchrun's own account

    def _launcher_report(self, a: AttemptView) -> None:
        """What torchrun wrote of its workers' ends, from this attempt's part of trainer.log: only
        in a run under a launcher (or with ranks found), never a summary a single process printed."""
        st = self.run.state
        if not _launcher_argv(a.argv) and not any(w.attempt == a.n for w in st.workers.values()):
            return
        text = _log_tail(str(self.run.log_path))
        mark = f"=== trainroom: attempt {a.n} at"
        if mark in text:
            text = text[text.rindex(mark) :]
        now = time.time()
        for rep in launcher_reports(text):
            w = st.workers.get(rep.pid)
            if w is None or w.attempt != a.n:
                if rep.rank is None or not rep.root_cause:
                    continue
                # Died before a probe cycle saw it: torchrun's word is all there is.
                self.recorder.emit(
                    p.WorkerSeen(
                        attempt=a.n,
                        t=a.ended_at or now,
                        pid=rep.pid,
                        rank=rep.rank,
                        start_ticks=0,
                        local_rank=rep.local_rank,
                    )
                )
                w = st.workers.get(rep.pid)
                if w is None:
                    continue
            status = rep.status
            self.recorder.emit(
                p.WorkerEnded(
                    attempt=a.n,
                    t=w.ended_at or a.ended_at or now,
                    pid=rep.pid,
                    rank=w.rank,
                    exit_code=status.code,
                    exit_signal=status.signal,
                    source="launcher",
                    root_cause=rep.root_cause,
                )
            )

    def close(self) -> None:
        for pid in list(self._handles):
            self._disarm(pid)


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
