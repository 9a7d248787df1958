"""The rank processes in the run's state and the watchdog's verdicts: the fold of WorkerSeen and
WorkerEnded, a stopped worker HUNG by its rank, a rank's death headlined before the launcher's
exit, an uninstrumented run under torchrun judged by its ranks' main threads, the status rows,
and the keeper's WorkerWatch journaling what the probes and torchrun's log say."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.run_builder import RunBuilder
from tests.support.waiting import wait_for
from trainroom.core.health.watchdog import WatchContext, Watchdog, context_from_probe
from trainroom.core.keeper.workers import WorkerWatch
from trainroom.core.probes.procs import read_stat
from trainroom.core.run.state import RunState
from trainroom.core.run.status import rank_rows, status_dict
from trainroom.core.samples import ProcsSample, Worker
from trainroom.core.wire import protocol as p

TORCHRUN = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
LEADER = 4242
W0, W1 = 5000, 5001


def _torchrun_run(instrumented: bool = False, restarts_left: int | None = 0) -> RunBuilder:
    b = RunBuilder()
    b.start(pid=LEADER, instrumented=False)
    b.run.attempts[-1].argv = TORCHRUN
    for rank, pid in ((0, W0), (1, W1)):
        b.apply(
            p.WorkerSeen(
                attempt=1,
                t=b.now,
                pid=pid,
                rank=rank,
                start_ticks=100 + rank,
                local_rank=rank,
                world_size=2,
                restarts_left=restarts_left,
            )
        )
        if instrumented:
            b.rx(p.Hello(pid=pid, world_size=2), rank=rank)
    return b


def _workers(states: dict[int, str]) -> list[Worker]:
    return [
        Worker(
            pid=pid, rank=pid - W0, state=st, start_ticks=100 + pid - W0, local_rank=pid - W0, world_size=2
        )
        for pid, st in sorted(states.items())
    ]


def _ctx(states: dict[int, str], activity: dict[int, int] | None = None, t: float = 0.0) -> WatchContext:
    sample = p.ProbeSample(
        t=t,
        procs=ProcsSample(
            attempt=1, pgid=LEADER, states={LEADER: "S"}, activity=activity or {}, workers=_workers(states)
        ),
    )
    return context_from_probe(sample, alive=True, attempt=1)


def _finding(v: Any, code: str) -> Any:
    (f,) = [f for f in v.findings if f.code == code]
    return f


# --------------------------------------------------------------------------- the fold


def test_worker_records_fold_and_the_kernels_word_stands_over_torchruns() -> None:
    b = _torchrun_run()
    assert sorted(b.run.workers) == [W0, W1] and b.run.attempt_workers() == [(W0, 100), (W1, 101)]
    b.now += 1
    b.apply(p.WorkerEnded(attempt=1, t=b.now, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.2, pid=W0, rank=0, source="gone"))
    # torchrun's summary: it names W1 the root cause and says how W0 ended; the kernel's word stands.
    b.apply(
        p.WorkerEnded(attempt=1, t=b.now + 1, pid=W1, rank=1, exit_code=3, source="launcher", root_cause=True)
    )
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 1, pid=W0, rank=0, exit_signal=15, source="launcher"))
    w0, w1 = b.run.workers[W0], b.run.workers[W1]
    assert (w1.exit_signal, w1.exit_code, w1.end_source, w1.root_cause) == (9, None, "wait-status", True)
    assert (w0.exit_signal, w0.end_source, w0.ended_at) == (15, "launcher", b.now + 0.2)
    assert b.run.attempt_workers() == []
    # A record for another attempt, or a pid never seen, changes nothing.
    b.apply(p.WorkerEnded(attempt=7, t=b.now, pid=W0, rank=0, exit_code=0, source="launcher"))
    b.apply(p.WorkerEnded(attempt=1, t=b.now, pid=1, rank=0, exit_code=0, source="launcher"))
    assert b.run.workers[W0].exit_signal == 15 and 1 not in b.run.workers
    # A new attempt starts with no workers.
    b.start(pid=LEADER + 1, instrumented=False)
    assert b.run.workers == {}


def test_the_root_cause_is_torchruns_named_one_else_the_first_to_fail_before_the_leader() -> None:
    b = _torchrun_run()
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 1, pid=W0, rank=0, exit_signal=15, source="wait-status"))
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 2, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    b.now += 3
    b.end(exit_code=1)
    a = b.run.attempt
    assert a is not None and b.run.worker_death(a).pid == W0  # type: ignore[union-attr]
    b.apply(
        p.WorkerEnded(attempt=1, t=b.now, pid=W1, rank=1, exit_signal=9, source="launcher", root_cause=True)
    )
    assert b.run.worker_death(a).pid == W1  # type: ignore[union-attr]


def test_a_clean_exit_of_every_worker_is_no_worker_death() -> None:
    b = _torchrun_run()
    for pid, rank in ((W0, 0), (W1, 1)):
        b.apply(p.WorkerEnded(attempt=1, t=b.now + 1, pid=pid, rank=rank, exit_code=0, source="wait-status"))
    b.now += 2
    b.end(exit_code=0)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "exited" and v.findings == []


# --------------------------------------------------------------------------- the watchdog


@pytest.mark.parametrize("instrumented", [False, True])
def test_a_stopped_worker_is_hung_naming_its_rank(instrumented: bool) -> None:
    b = _torchrun_run(instrumented)
    b.steps(20)
    v = Watchdog().evaluate(b.run, _ctx({W0: "S", W1: "T"}), b.now + 0.1)
    assert v.state == "hung" and v.reason == f"rank 1 (pid {W1}) stopped (state T)"
    f = _finding(v, "HUNG")
    assert f.evidence["rank"] == 1 and f.evidence["pid"] == W1 and f.evidence["cause"] == "stopped"
    assert f.message.startswith(f"rank 1 (pid {W1}) is stopped")


def test_a_worker_in_d_state_is_hung_only_once_it_persists() -> None:
    b = _torchrun_run()
    b.steps(20)
    wd = Watchdog()
    assert wd.evaluate(b.run, _ctx({W0: "D", W1: "S"}), b.now + 0.1).state != "hung"
    v = wd.evaluate(b.run, _ctx({W0: "D", W1: "S"}), b.now + 120)
    assert v.state == "hung" and _finding(v, "HUNG").evidence["rank"] == 0


def _gap(parked_ranks: int) -> Any:
    """An uninstrumented torchrun run (steps from rank 0's log) 30 s past its last step."""
    b = _torchrun_run()
    for _ in range(30):
        b.now += 0.1
        b.do_step(source="log")
    wd = Watchdog()
    last = b.now
    v = None
    for k in range(31):
        counters = {W0: 10 + (k if parked_ranks < 2 else 0), W1: 20}
        if parked_ranks == 0:
            counters[W1] += k
        v = wd.evaluate(
            b.run, _ctx({W0: "S", W1: "S"}, activity={**counters, LEADER: k}, t=last + k), last + k
        )
    return v


def test_uninstrumented_ranks_all_parked_past_the_bound_is_hung_naming_them() -> None:
    v = _gap(parked_ranks=2)
    assert v.state == "hung"
    f = _finding(v, "HUNG")
    assert (
        f.evidence["ranks"] == [0, 1] and f.evidence["pids"] == [W0, W1] and f.evidence["cause"] == "parked"
    )
    assert f"rank 0 (pid {W0}), rank 1 (pid {W1})" in f.message and "collective" in f.message


def test_uninstrumented_one_rank_still_running_is_a_stall_whatever_the_launcher_does() -> None:
    v = _gap(parked_ranks=1)
    assert v.state == "stalled" and "HUNG" not in {f.code for f in v.findings}


def test_a_killed_worker_is_the_headline_and_torchruns_exit_comes_second() -> None:
    b = _torchrun_run()
    b.steps(40)
    b.verified(30)
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.2, pid=W0, rank=0, exit_signal=15, source="wait-status"))
    b.now += 0.5
    b.end(exit_code=1)
    log_crash = p.Crash(
        t=b.now, chain=[p.ErrorLink(type="RuntimeError", message="Connection closed by peer")]
    )
    v = Watchdog().evaluate(b.run, WatchContext(alive=False, log_crash=log_crash), b.now)
    assert v.state == "dead" and v.reason == f"rank 1 killed by SIGKILL (pid {W1}); then torchrun exit code 1"
    f = _finding(v, "DEAD")
    assert f.message == (
        f"attempt 1: rank 1 killed by SIGKILL (pid {W1}) at step 40; 10 steps lost since the last verified "
        "checkpoint (step 30) (no traceback); then torchrun exit code 1"
    )
    assert f.evidence["rank"] == 1 and f.evidence["exit_code"] == 1
    assert f.evidence["worker"] == {
        "rank": 1,
        "pid": W1,
        "exit_code": None,
        "exit_signal": 9,
        "signal": "SIGKILL",
        "source": "wait-status",
        "ended_at": b.now - 0.49,
    }


def test_a_failed_worker_with_no_restart_left_is_dead_before_torchrun_exits() -> None:
    b = _torchrun_run()
    b.steps(12)
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    v = Watchdog().evaluate(b.run, _ctx({W0: "S"}), b.now + 0.1)
    assert v.state == "dead"
    assert v.reason == f"rank 1 killed by SIGKILL (pid {W1}); torchrun is stopping the other ranks"
    f = _finding(v, "DEAD")
    assert f.message.startswith(f"attempt 1: rank 1 killed by SIGKILL (pid {W1}) at step 12")
    assert f.message.endswith("; torchrun is stopping the other ranks (no restart left)")
    assert f.evidence["exit_code"] is None and f.evidence["worker"]["signal"] == "SIGKILL"


def _lightning_run() -> RunBuilder:
    """Lightning DDP: the process started is rank 0 and re-runs the script for rank 1 (no torch
    elastic: no restarts_left)."""
    b = RunBuilder()
    b.start(pid=W0, instrumented=False)
    b.run.attempts[-1].argv = ["python", "train.py"]
    for rank, pid in ((0, W0), (1, W1)):
        b.apply(p.WorkerSeen(attempt=1, t=b.now, pid=pid, rank=rank, start_ticks=100 + rank, local_rank=rank))
    b.steps(12)
    return b


def test_a_failed_rank_of_lightnings_own_launcher_is_dead_before_rank_0_fails() -> None:
    """No one restarts a rank of Lightning's own launcher: rank 1's death ends the attempt at
    once, not when rank 0 fails at its next collective (about 3 s later)."""
    b = _lightning_run()
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    v = Watchdog().evaluate(b.run, _ctx({W0: "S"}), b.now + 0.1)
    assert v.state == "dead"
    lead = f"rank 0 (pid {W0}, the process started)"
    assert (
        v.reason
        == f"rank 1 killed by SIGKILL (pid {W1}); {lead} launched it and restarts no rank: the attempt is over"
    )
    f = _finding(v, "DEAD")
    assert f.message.startswith(f"attempt 1: rank 1 killed by SIGKILL (pid {W1}) at step 12")
    assert f.message.endswith(f"; {lead} launched it and restarts no rank: the attempt is over")


def test_a_rank_ended_by_a_users_kill_is_no_death() -> None:
    """A user's kill under way: a rank that ends by it (before rank 0) is the kill's doing."""
    b = _lightning_run()
    b.apply(p.AttemptStopping(n=1, t=b.now, by="cli pid 1", until=b.now + 10))
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W1, rank=1, exit_signal=15, source="wait-status"))
    v = Watchdog().evaluate(b.run, _ctx({W0: "S"}), b.now + 0.1)
    assert v.state != "dead" and not [f for f in v.findings if f.code == "DEAD"]


@pytest.mark.parametrize(
    ("restarts_left", "end"),
    [
        (2, {"exit_signal": 9}),  # torch elastic restarts the group: not the end of the attempt
        (None, {"exit_signal": 9}),  # not torch elastic: the launcher decides
        (0, {}),  # gone, how unknown (a clean exit reaped before it was read): not a failure
        (0, {"exit_code": 0}),  # rank 1 finished first
    ],
)
def test_a_worker_end_that_does_not_end_the_attempt(restarts_left: int | None, end: dict[str, int]) -> None:
    b = _torchrun_run(restarts_left=restarts_left)
    b.steps(12)
    src = "gone" if not end else "wait-status"
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W1, rank=1, source=src, **end))  # type: ignore[arg-type]
    v = Watchdog().evaluate(b.run, _ctx({W0: "S"}), b.now + 0.1)
    assert v.state == "running" and not v.findings


def test_a_worker_that_raised_keeps_its_traceback_and_a_plain_launcher_is_named_by_pid() -> None:
    b = _torchrun_run()
    b.run.attempts[-1].argv = ["bash", "launch.sh"]
    b.steps(5)
    b.apply(p.WorkerEnded(attempt=1, t=b.now + 0.01, pid=W0, rank=0, exit_code=1, source="launcher"))
    b.now += 1
    b.end(exit_code=1)
    crash = p.Crash(t=b.now, chain=[p.ErrorLink(type="ValueError", message="bad batch")])
    f = _finding(Watchdog().evaluate(b.run, WatchContext(alive=False, log_crash=crash), b.now), "DEAD")
    assert f.message.startswith(f"attempt 1: rank 0 exit code 1 (pid {W0}) at step 5")
    assert "(ValueError: bad batch); then the launcher (pid 4242) exit code 1" in f.message


def test_workers_the_dead_leader_left_running_are_named_for_the_kill() -> None:
    b = _torchrun_run()
    b.steps(5)
    b.end(exit_signal=signal.SIGKILL)
    f = _finding(Watchdog().evaluate(b.run, WatchContext(alive=False), b.now), "DEAD")
    assert f.message.startswith("attempt 1 killed by SIGKILL")
    assert f.message.endswith(
        f"still running: rank 0 (pid {W0}), rank 1 (pid {W1}): kill them before a resume"
    )
    assert f.evidence["rank"] is None


# --------------------------------------------------------------------------- status


def test_status_rows_join_telemetry_and_processes() -> None:
    b = _torchrun_run(instrumented=True)
    b.steps(3)  # rank 0 reports steps
    b.run.probe = p.ProbeSample(
        t=b.now,
        procs=ProcsSample(attempt=1, pgid=LEADER, states={LEADER: "S"}, workers=_workers({W0: "R", W1: "T"})),
    )
    rows = rank_rows(b.run)
    assert [(r["rank"], r["local_rank"], r["pid"], r["state"], r["step"]) for r in rows] == [
        (0, 0, W0, "running", 3),
        (1, 1, W1, "stopped", None),
    ]
    assert rows[0]["connected"] is True and rows[0]["world_size"] == 2 and rows[0]["exit"] is None
    # The contract's keys, for the tools built on it (the multi-node job view among them).
    assert {"rank", "local_rank", "pid", "state", "step", "loss", "connected", "exit"} <= set(rows[0])
    b.apply(p.WorkerEnded(attempt=1, t=b.now, pid=W1, rank=1, exit_signal=9, source="wait-status"))
    (_, r1) = rank_rows(b.run)
    assert r1["state"] == "dead" and r1["exit"] == {"code": None, "signal": 9, "signal_name": "SIGKILL"}
    # With the keeper gone, a state nobody read now is null, not invented.
    (r0, _) = rank_rows(b.run, keeper_alive=False)
    assert r0["state"] is None and r0["pid"] == W0
    assert status_dict(b.run)["ranks"] == rank_rows(b.run)


def test_a_single_process_run_keeps_its_one_rank_row() -> None:
    b = RunBuilder()
    b.start(pid=LEADER)
    b.steps(2)
    b.run.probe = p.ProbeSample(t=b.now, procs=ProcsSample(attempt=1, pgid=LEADER, states={LEADER: "R"}))
    (row,) = rank_rows(b.run)
    assert (row["rank"], row["pid"], row["state"], row["step"], row["local_rank"]) == (
        0,
        LEADER,
        "running",
        2,
        None,
    )


# --------------------------------------------------------------------------- the keeper's WorkerWatch


class FakeKeeper:
    """A Recorder and RunContext over a real RunState: what the keeper gives its parts."""

    def __init__(self, run: RunState, log: Path) -> None:
        self.state = run
        self.log_path = log
        self.emitted: list[Any] = []

    def emit(self, rec: Any, *, journal: bool = True) -> None:
        self.state.apply(rec)
        self.emitted.append(rec)


def test_worker_watch_journals_seen_and_ended_from_torchruns_summary(tmp_path: Path) -> None:
    from tests.unit.test_workers_probe import TORCHRUN_LOG

    b = RunBuilder()
    b.start(pid=LEADER, instrumented=False)
    log = tmp_path / "trainer.log"
    log.write_text("=== trainroom: attempt 1 at 2026-12-03 12:14:40: torchrun ... ===\n" + TORCHRUN_LOG)
    k = FakeKeeper(b.run, log)
    watch = WorkerWatch(k, k)  # type: ignore[arg-type]
    sample_workers = [
        Worker(pid=766, rank=0, state="S", start_ticks=1, local_rank=0, world_size=2),
        Worker(pid=767, rank=1, state="S", start_ticks=2, local_rank=1, world_size=2),
    ]
    k.state.probe = p.ProbeSample(t=b.now, procs=ProcsSample(attempt=1, workers=sample_workers))
    watch.sync()
    watch.sync()  # the same cycle again: nothing new
    assert [type(r).__name__ for r in k.emitted] == ["WorkerSeen", "WorkerSeen"]
    b.now += 5
    b.end(exit_code=1)
    watch.sync()
    ends = [r for r in k.emitted if isinstance(r, p.WorkerEnded)]
    assert {(r.pid, r.exit_signal, r.source, r.root_cause) for r in ends if r.source == "launcher"} == {
        (766, 15, "launcher", False),
        (767, 9, "launcher", False),
        (767, 9, "launcher", True),
    }
    a = k.state.attempt
    assert a is not None
    w = k.state.worker_death(a)
    assert w is not None and (w.rank, w.pid, w.exit_signal) == (1, 767, 9)


def test_worker_watch_reads_the_wait_status_the_moment_a_worker_exits(tmp_path: Path) -> None:
    """A real child of this test stands in for a worker: the pidfd wakes the keeper's loop, which
    reads the zombie's status before anyone reaps it."""
    if not hasattr(__import__("os"), "pidfd_open"):
        pytest.skip("no pidfd_open here")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)
    try:
        st = read_stat(proc.pid)
        assert st is not None
        b = RunBuilder()
        b.start(pid=LEADER, instrumented=False)
        k = FakeKeeper(b.run, tmp_path / "trainer.log")

        async def main() -> None:
            watch = WorkerWatch(k, k)  # type: ignore[arg-type]
            worker = Worker(pid=proc.pid, rank=3, state="S", start_ticks=st.start_ticks)
            k.state.probe = p.ProbeSample(t=b.now, procs=ProcsSample(attempt=1, workers=[worker]))
            watch.sync()
            proc.send_signal(signal.SIGKILL)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not any(isinstance(r, p.WorkerEnded) for r in k.emitted) and loop.time() < deadline:
                await asyncio.sleep(0.01)
            watch.close()

        asyncio.run(main())
        (ended,) = [r for r in k.emitted if isinstance(r, p.WorkerEnded)]
        assert (ended.rank, ended.exit_signal, ended.source) == (3, signal.SIGKILL, "wait-status")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_worker_watch_marks_a_vanished_worker_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)
    st = read_stat(proc.pid)
    assert st is not None
    b = RunBuilder()
    b.start(pid=LEADER, instrumented=False)
    k = FakeKeeper(b.run, tmp_path / "trainer.log")
    watch = WorkerWatch(k, k)  # type: ignore[arg-type]
    k.state.probe = p.ProbeSample(
        t=1.0,
        procs=ProcsSample(
            attempt=1, workers=[Worker(pid=proc.pid, rank=0, state="S", start_ticks=st.start_ticks)]
        ),
    )
    watch.sync()
    k.state.probe = p.ProbeSample(t=2.0, procs=ProcsSample(attempt=1, workers=[]))
    watch.sync()  # missing from the cycle but still alive: not gone
    assert not any(isinstance(r, p.WorkerEnded) for r in k.emitted)
    proc.kill()
    proc.wait(timeout=30)
    wait_for(
        lambda: read_stat(proc.pid) is None or read_stat(proc.pid).start_ticks != st.start_ticks, timeout=30
    )  # type: ignore[union-attr]
    k.state.probe = p.ProbeSample(t=3.0, procs=ProcsSample(attempt=1, workers=[]))
    watch.sync()
    (ended,) = [r for r in k.emitted if isinstance(r, p.WorkerEnded)]
    assert ended.source == "gone" and ended.exit_code is None and ended.exit_signal is None
