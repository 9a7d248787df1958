"""Which rank a line, a crash, a death or a restart belongs to, from states built by the real
fold: the log's rank from the workers' environment (never a default 0 on a node whose only
worker is rank 1), a `[rankN]:` prefix on a traceback, the job's root cause from a rank's own
end, RANK_RESTARTED for each group torch elastic restarted, a restarted group's death not taken
for the attempt's, Lightning's rank 0 named as the process started, and a DEAD that names the HF
checkpoints nobody watched."""

from __future__ import annotations

import signal
from pathlib import Path

from trainroom.core.configuration.settings import JobOptions, LaunchOptions
from trainroom.core.health.life import dead_finding, launcher_name, unwatched_checkpoints
from trainroom.core.health.ranks import rank_restarted
from trainroom.core.health.watchdog import WatchContext
from trainroom.core.job.view import NodeReading, job_dict
from trainroom.core.keeper.workers import RANKS_WAIT_S, crash_rank, log_rank
from trainroom.core.probes.runof import RunOf
from trainroom.core.probes.workers import prefixed_rank
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

T0 = 1_000_000.0
TORCHRUN = ["python", "-m", "torch.distributed.run", "--nnodes=2", "train.py"]


def _run(argv: list[str], node_rank: int | None = None, cwd: str = "/") -> RunState:
    job = JobOptions(name="j", source="--job", host=f"h{node_rank}", node_rank=node_rank)
    st = RunState(
        run_id=f"run{node_rank}",
        argv=argv,
        cwd=cwd,
        created=T0,
        options=LaunchOptions(job=job if node_rank is not None else None),
    )
    st.apply(p.AttemptStarted(n=1, t=T0, pid=100, pgid=100, start_time=T0, argv=argv, cwd=cwd))
    return st


def _seen(st: RunState, pid: int, rank: int, t: float = T0 + 1, left: int | None = None) -> None:
    st.apply(
        p.WorkerSeen(attempt=1, t=t, pid=pid, rank=rank, start_ticks=pid, local_rank=0, restarts_left=left)
    )


def _ended(
    st: RunState, pid: int, rank: int, t: float, sig: int | None = None, code: int | None = None
) -> None:
    st.apply(
        p.WorkerEnded(
            attempt=1, t=t, pid=pid, rank=rank, exit_code=code, exit_signal=sig, source="wait-status"
        )
    )


def test_global_rank_from_the_environment_never_a_default_zero() -> None:
    assert RunOf(None, None, rank=3).global_rank() == 3
    torchrun = RunOf(None, None, rank=None, local_rank=1, node_rank=2, local_world_size=4)
    assert torchrun.global_rank() == 9  # GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK
    lightning = RunOf(None, None, rank=None, local_rank=1, node_rank=1)
    assert lightning.global_rank() is None and lightning.global_rank(3) == 4
    assert RunOf(None, None, rank=None, local_rank=1, node_rank=0).global_rank() == 1
    assert RunOf(None, None, rank=None, local_rank=1).global_rank() is None


def test_log_lines_go_to_the_rank_the_workers_say() -> None:
    st = _run(TORCHRUN, node_rank=1)
    # A launcher whose ranks are not found yet: its lines wait (never filed under a rank 0).
    assert log_rank(st, T0 + 1) is None
    assert log_rank(st, T0 + RANKS_WAIT_S + 1) == 0  # found none in time: a process of its own
    _seen(st, 501, rank=1)
    assert log_rank(st, T0 + 2) == 1
    assert crash_rank(st, ["Traceback (most recent call last):"], T0 + 2) == 1
    assert crash_rank(st, ["[rank3]: Traceback (most recent call last):", "[rank3]: OSError: x"], T0 + 2) == 3
    assert prefixed_rank(["[rank0]:[W1204 12:00:00] warning", "plain"]) == 0
    assert prefixed_rank(["no prefix"]) is None
    plain = _run(["python", "train.py"])
    assert log_rank(plain, T0) == 0  # one process: rank 0 of 1


def _node(node_rank: int, rank: int, pid: int) -> RunState:
    st = _run(TORCHRUN, node_rank=node_rank)
    _seen(st, pid, rank)
    for s in range(1, 6):  # the log's steps, filed under the node's worker rank
        msg = p.Step(step=s, t=T0 + 1 + s, loss=1.0, source="log")
        st.apply(p.Received(attempt=1, rank=rank, t=T0 + 1 + s, msg=msg))
    return st


def test_uninstrumented_job_root_cause_is_the_killed_rank_with_its_signal() -> None:
    n0, n1 = _node(0, 0, 500), _node(1, 1, 501)
    _ended(n1, 501, 1, T0 + 10.0, sig=signal.SIGKILL)
    _ended(n0, 500, 0, T0 + 10.4, code=1)  # gloo: Connection reset by peer
    n1.apply(p.AttemptEnded(n=1, t=T0 + 10.3, exit_code=1))
    n0.apply(p.AttemptEnded(n=1, t=T0 + 10.5, exit_code=1))
    for st in (n0, n1):
        st.apply(p.RunStatus(t=T0 + 11, state="dead"))
    nodes = [
        NodeReading(target="local", host="h0", run="run0", state=n0, keeper="alive"),
        NodeReading(target="ssh://h1/run1", host="h1", run="run1", state=n1, keeper="alive"),
    ]
    d = job_dict("j", nodes, T0 + 12)
    rc = d["root_cause"]
    assert (rc["rank"], rc["node_rank"], rc["signal"], rc["t"]) == (1, 1, signal.SIGKILL, T0 + 10.0)
    assert "rank 1 on node 1 (h1) failed first" in rc["message"] and "killed by SIGKILL" in rc["message"]
    assert [(r["rank"], r["node_rank"]) for r in d["ranks"]] == [(0, 0), (1, 1)]  # no phantom rank 0


def test_a_restarted_group_is_rank_restarted_and_its_death_is_not_the_attempts() -> None:
    st = _run(["torchrun", "--max-restarts=3", "train.py"])
    _seen(st, 500, 0, left=3)
    _seen(st, 501, 1, left=3)
    assert rank_restarted(st) is None
    _ended(st, 501, 1, T0 + 5, sig=signal.SIGKILL)
    _ended(st, 500, 0, T0 + 5.2, sig=signal.SIGTERM)  # torchrun stops the rest of the group
    assert rank_restarted(st) is None  # not restarted yet
    _seen(st, 600, 0, t=T0 + 8, left=2)
    _seen(st, 601, 1, t=T0 + 8, left=2)
    f = rank_restarted(st)
    assert f is not None and f.code == "RANK_RESTARTED"
    assert f.message.startswith(
        "rank 1 died (killed by SIGKILL) and torchrun restarted the group, restart 1 of 3"
    ), f.message
    assert f.evidence["rank"] == 1 and f.evidence["pid"] == 501 and f.evidence["restarts_left"] == 2
    a = st.attempt
    assert a is not None and st.worker_death(a) is None  # absorbed: not what ends the attempt
    _ended(st, 600, 0, T0 + 20, code=1)
    w = st.worker_death(a)
    assert w is not None and w.pid == 600


def test_lightning_rank_0_is_the_process_started_and_not_its_own_death() -> None:
    st = _run(["python", "train.py"])
    _seen(st, 100, 0)  # the leader: Lightning's rank 0
    _seen(st, 501, 1)
    _ended(st, 501, 1, T0 + 5, sig=signal.SIGKILL)
    _ended(st, 100, 0, T0 + 6, code=1)
    st.apply(p.AttemptEnded(n=1, t=T0 + 6, exit_code=1))
    a = st.attempt
    assert a is not None
    w = st.worker_death(a)
    assert w is not None and w.rank == 1
    assert launcher_name(a, st) == "rank 0 (pid 100, the process started)"
    f = dead_finding(st, a, WatchContext())
    assert "attempt 1: rank 1 killed by SIGKILL (pid 501)" in f.message
    assert "then rank 0 (pid 100, the process started) exit code 1" in f.message


def test_dead_names_unwatched_hf_checkpoints_and_offers_no_resume(tmp_path: Path) -> None:
    for step in (200, 400):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-50").mkdir()
    st = _run(["python", "train.py"], cwd=str(tmp_path))
    for s in range(1, 450):
        st.apply(
            p.Received(attempt=1, rank=0, t=T0 + s, msg=p.Step(step=s, t=T0 + s, loss=1.0, source="log"))
        )
    st.apply(p.AttemptEnded(n=1, t=T0 + 500, exit_signal=signal.SIGKILL))
    a = st.attempt
    assert a is not None
    assert unwatched_checkpoints(st, a) == ["out/checkpoint-400", "out/checkpoint-200", "checkpoint-50"]
    f = dead_finding(st, a, WatchContext())
    assert "no verified checkpoint" in f.message
    assert "out/checkpoint-400/ (and 2 more) in the working directory is not watched" in f.message
    assert "--watch-ckpt 'out/checkpoint-*'" in f.message
    assert f.action is None
    # Once watched (the keeper knows the directory), nothing is said and a resume is offered.
    watched = _run(["python", "train.py"], cwd=str(tmp_path / "elsewhere"))
    watched.apply(p.AttemptEnded(n=1, t=T0 + 5, exit_code=1))
    wa = watched.attempt
    assert wa is not None and unwatched_checkpoints(watched, wa) == []
    assert dead_finding(watched, wa, WatchContext()).action == "resume"
