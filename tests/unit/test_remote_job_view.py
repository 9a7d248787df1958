"""The job's merged view from its nodes' states (core/job/view.py) and the stack comparison
(core/job/actions.py), from states built by the real fold."""

from __future__ import annotations

from trainroom.core.configuration.settings import JobOptions, LaunchOptions
from trainroom.core.job.actions import compare_stacks, main_thread_frames, parked_at
from trainroom.core.job.view import NodeReading, job_dict, worst
from trainroom.core.remote.link import Reachability
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

T0 = 1_000_000.0


def node(node_rank: int, rank: int, *, pid: int) -> RunState:
    st = RunState(
        run_id=f"run{node_rank}",
        argv=["torchrun"],
        cwd="/",
        created=T0,
        options=LaunchOptions(
            job=JobOptions(name="j", source="--job", host=f"h{node_rank}", node_rank=node_rank)
        ),
    )
    st.apply(
        p.AttemptStarted(
            n=1, t=T0, pid=100 + node_rank, pgid=100 + node_rank, start_time=T0, argv=["torchrun"], cwd="/"
        )
    )
    st.apply(p.Received(attempt=1, rank=rank, t=T0 + 1, msg=p.Hello(pid=pid, rank=rank, world_size=2)))
    for s in range(1, 6):
        st.apply(p.Received(attempt=1, rank=rank, t=T0 + 1 + s, msg=p.Step(step=s, t=T0 + 1 + s, loss=1.0)))
    st.apply(p.RunStatus(t=T0 + 7, state="running"))
    return st


def reading(st: RunState, target: str, host: str) -> NodeReading:
    return NodeReading(target=target, host=host, run=st.run_id, state=st, keeper="alive")


def test_a_kill_on_node_1_is_the_root_cause_though_node_0_ended_too() -> None:
    n0, n1 = node(0, 0, pid=10), node(1, 1, pid=11)
    n1.apply(p.TrainerDisconnected(attempt=1, rank=1, t=T0 + 10.0))  # SIGKILLed: its link closes at once
    n0.apply(p.TrainerDisconnected(attempt=1, rank=0, t=T0 + 10.2))  # then the collective fails it
    n1.apply(p.AttemptEnded(n=1, t=T0 + 10.3, exit_code=1))
    n0.apply(p.AttemptEnded(n=1, t=T0 + 10.25, exit_code=1))
    for st in (n0, n1):
        st.apply(p.RunStatus(t=T0 + 10.4, state="dead"))
    d = job_dict("j", [reading(n0, "local", "h0"), reading(n1, "ssh://h1/run1", "h1")], T0 + 11)
    assert d["state"] == "dead"
    rc = d["root_cause"]
    assert (rc["rank"], rc["node_rank"], rc["host"], rc["node"], rc["t"]) == (
        1,
        1,
        "h1",
        "ssh://h1/run1",
        T0 + 10.0,
    )
    assert [(r["rank"], r["node_rank"], r["pid"], r["state"]) for r in d["ranks"]] == [
        (0, 0, 10, "dead"),
        (1, 1, 11, "dead"),
    ]


def test_an_unreachable_node_is_never_dead_and_the_job_is_as_bad_as_its_worst_node() -> None:
    n0, n1 = node(0, 0, pid=10), node(1, 1, pid=11)
    lost = Reachability()
    lost.lost(T0 + 8, "link lost", T0 + 9)
    r1 = NodeReading(target="ssh://h1", host="h1", run="run1", state=n1, keeper="alive", reach=lost)
    d = job_dict("j", [reading(n0, "local", "h0"), r1], T0 + 9)
    assert [n["state"] for n in d["nodes"]] == ["running", "unreachable"]
    assert d["state"] == "unreachable" and d["root_cause"] is None
    assert d["nodes"][1]["unreachable_since"] == T0 + 8 and d["nodes"][1]["link"].startswith(
        "unreachable since"
    )
    assert worst(["running", "hung", "unreachable", "exited"]) == "hung"
    assert worst(["exited", "running"]) == "running"


def test_a_stopped_rank_is_named_as_not_arrived_where_the_others_wait() -> None:
    n0, n1 = node(0, 0, pid=10), node(1, 1, pid=11)
    n0.apply(
        p.Received(
            attempt=1,
            rank=0,
            t=T0 + 20,
            msg=p.Heartbeat(t=T0 + 20, main_frame="train.py:40 in main", main_frame_age_s=12.0),
        )
    )
    n0.apply(p.RunStatus(t=T0 + 20, state="hung", reason="main thread parked"))
    n1.apply(p.RunStatus(t=T0 + 20, state="stalled"))  # its rank stopped: no heartbeat since T0+6
    d = job_dict("j", [reading(n0, "local", "h0"), reading(n1, "ssh://h1", "h1")], T0 + 20.5)
    assert d["state"] == "hung"
    hang = d["hang"]
    assert [m["rank"] for m in hang["not_arrived"]] == [1] and "no heartbeat" in hang["not_arrived"][0]["why"]
    assert hang["waiting_at"] == "train.py:40 in main" and [w["rank"] for w in hang["waiting"]] == [0]
    assert "rank 1 (node 1, h1) did not arrive" in hang["summary"]


PYSPY = """Process 123: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 123 (idle): "MainThread"
    allreduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2801)
    wrapper (/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83)
    step (/work/train.py:40)
    main (/work/train.py:55)
Thread 130 (idle): "trainroom-heartbeat"
    wait (threading.py:331)
"""

FAULTHANDLER = """Thread 0x00007f0000000001 (most recent call first):
  File "/x/trainroom/core/sdk/reporter.py", line 200 in _heartbeat
Current thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/site-packages/torch/autograd/graph.py", line 823 in _engine_run_backward
  File "/work/train.py", line 33 in main
"""


def test_stacks_from_py_spy_and_faulthandler_give_the_main_threads_frames() -> None:
    frames = main_thread_frames(PYSPY)
    assert [f.split(" (")[0] for f in frames] == ["allreduce", "wrapper", "step", "main"]
    assert parked_at(frames) == "step (train.py:40) → allreduce"
    assert main_thread_frames(FAULTHANDLER)[-1] == "main (/work/train.py:33)"
    assert parked_at(main_thread_frames(FAULTHANDLER)) == "main (train.py:33) → _engine_run_backward"


def test_compared_stacks_name_the_rank_that_is_elsewhere() -> None:
    base = {"node_rank": 0, "host": "h", "message": "ok"}
    elsewhere = PYSPY.replace("step (/work/train.py:40)", "load (/work/data.py:7)").replace(
        "allreduce", "read"
    )
    report = compare_stacks(
        [
            {**base, "rank": 0, "stacks": PYSPY},
            {**base, "rank": 2, "stacks": PYSPY},
            {**base, "rank": 1, "node_rank": 1, "stacks": elsewhere},
        ]
    )
    assert report["waiting_at"] == "step (train.py:40) → allreduce"
    assert [m["rank"] for m in report["not_arrived"]] == [1]


def test_a_stopped_rank_did_not_arrive_though_it_stopped_where_the_others_wait() -> None:
    # SIGSTOPped inside the all-reduce: its frames are the others', but it runs no code there.
    base = {"node_rank": 0, "host": "h", "message": "ok"}
    report = compare_stacks(
        [
            {**base, "rank": 0, "stacks": PYSPY},
            {**base, "rank": 1, "node_rank": 1, "stacks": PYSPY, "stopped": True},
        ]
    )
    assert report["waiting_at"] == "step (train.py:40) → allreduce"
    (m,) = report["not_arrived"]
    assert m["rank"] == 1 and m["stopped"] and m["parked_at"] == report["waiting_at"]
    from trainroom.core.job.actions import stacks_lines

    assert stacks_lines(report)[-1] == (
        "did not arrive: rank 1 (node 1, h): stopped (it runs no code until SIGCONT), at step (train.py:40) → allreduce"
    )


def test_a_rank_whose_process_is_stopped_did_not_arrive_whatever_its_link_says() -> None:
    """A torchrun worker SIGSTOPped a moment ago: its heartbeat is still fresh, but its node's
    probe reads the process in state T. The job names it, not "no rank stands out"."""
    from trainroom.core.samples import ProcsSample, Worker

    n0, n1 = node(0, 0, pid=10), node(1, 1, pid=11)
    n0.apply(p.Received(attempt=1, rank=0, t=T0 + 6.4, msg=p.Heartbeat(t=T0 + 6.4)))
    n1.apply(p.Received(attempt=1, rank=1, t=T0 + 6.4, msg=p.Heartbeat(t=T0 + 6.4)))  # stopped just after
    n1.apply(p.WorkerSeen(attempt=1, t=T0 + 2, pid=11, rank=1, start_ticks=5))
    n1.apply(
        p.ProbeSample(
            t=T0 + 6.5,
            procs=ProcsSample(
                attempt=1,
                pgid=101,
                states={101: "S"},
                workers=[Worker(pid=11, rank=1, state="T", start_ticks=5)],
            ),
        )
    )
    n1.apply(p.RunStatus(t=T0 + 6.5, state="hung", reason="rank 1 is stopped"))
    d = job_dict("j", [reading(n0, "local", "h0"), reading(n1, "ssh://h1", "h1")], T0 + 6.6)
    assert d["state"] == "hung"
    (r1,) = [r for r in d["ranks"] if r["rank"] == 1]
    assert r1["state"] == "stopped"
    assert [m["rank"] for m in d["hang"]["not_arrived"]] == [1]
    assert "stopped" in d["hang"]["not_arrived"][0]["why"]


def test_a_rank_that_raised_peer_lost_is_a_consequence_though_its_keeper_noticed_first() -> None:
    # Each keeper stamps what it sees when it sees it: under load the killed rank's keeper can
    # notice its death after the survivor's has already journaled the survivor's gloo error.
    n0, n1 = node(0, 0, pid=10), node(1, 1, pid=11)
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242"
    n0.apply(
        p.Received(
            attempt=1,
            rank=0,
            t=T0 + 9.9,
            msg=p.Crash(t=T0 + 9.9, chain=[p.ErrorLink(type="RuntimeError", message=gloo)]),
        )
    )
    n0.apply(p.TrainerDisconnected(attempt=1, rank=0, t=T0 + 9.95))
    n1.apply(p.TrainerDisconnected(attempt=1, rank=1, t=T0 + 10.0))
    n1.apply(p.AttemptEnded(n=1, t=T0 + 10.0, exit_signal=9))
    n0.apply(p.AttemptEnded(n=1, t=T0 + 10.5, exit_code=1))
    for st in (n0, n1):
        st.apply(p.RunStatus(t=T0 + 10.6, state="dead"))
    rc = job_dict("j", [reading(n0, "local", "h0"), reading(n1, "ssh://h1/run1", "h1")], T0 + 11)[
        "root_cause"
    ]
    assert (rc["rank"], rc["host"], rc["signal_name"]) == (1, "h1", "SIGKILL"), rc
    # Without the survivor's error, the earliest observation stands.
    n0.attempt.crash = None  # type: ignore[union-attr]
    rc = job_dict("j", [reading(n0, "local", "h0"), reading(n1, "ssh://h1/run1", "h1")], T0 + 11)[
        "root_cause"
    ]
    assert rc["rank"] == 0
