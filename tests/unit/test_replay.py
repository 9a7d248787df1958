"""The batch behind a spike: a step's batch identity through the SDK and the protocol, the keeper's
window of them journaled once when a spike, divergence or non-finite value opens, the replay's
environment round trip, and the verdict's three answers."""

from __future__ import annotations

import math

import msgspec
import pytest

from trainroom.core.cli.replay import verdict
from trainroom.core.findings import Finding
from trainroom.core.keeper.batches import BatchWindow
from trainroom.core.run.handlers.findings import BATCH_LOGS
from trainroom.core.run.state import RunState
from trainroom.core.sdk.replay import ReplayRequest, replay_env, replay_request
from trainroom.core.sdk.reporter import batch_ref
from trainroom.core.wire import protocol as p


def _step(attempt: int, rank: int, step: int, loss: float, index: int | None = None) -> p.Received:
    batch = p.BatchRef(seed=7, index=step if index is None else index)
    return p.Received(
        t=float(step), attempt=attempt, rank=rank, msg=p.Step(step=step, t=1.0, loss=loss, batch=batch)
    )


def _finding(code: str, rank: int | None = None) -> Finding:
    ev = {"step": 31} if rank is None else {"step": 31, "rank": rank}
    return Finding(code=code, severity="warning", message="m", evidence=ev)  # type: ignore[arg-type]


def test_the_window_is_journaled_once_for_a_finding_the_data_may_cause() -> None:
    w = BatchWindow(window=8)
    for s in range(1, 21):
        w.observe(_step(1, 0, s, 2.0))
        w.observe(_step(1, 1, s, 3.0))
    assert w.raised(_finding("STALLED"), attempt=1) is None  # not a data question
    log = w.raised(_finding("LOSS_SPIKE"), attempt=1)
    assert log is not None and log.code == "LOSS_SPIKE" and log.rank == 0
    assert [r.step for r in log.rows] == list(range(13, 21))  # the last 8 steps of rank 0
    assert log.rows[-1].batch == p.BatchRef(seed=7, index=20) and log.rows[-1].loss == 2.0
    assert w.raised(_finding("LOSS_SPIKE"), attempt=1) is None  # once per finding
    other = w.raised(_finding("NONFINITE", rank=1), attempt=1)
    assert other is not None and other.rank == 1 and other.rows[-1].loss == 3.0
    # A new attempt starts a new window: the old attempt's batches are not what it names.
    w.observe(_step(2, 0, 5, 2.5))
    assert w.raised(_finding("DIVERGENCE"), attempt=1) is None
    log2 = w.raised(_finding("DIVERGENCE"), attempt=2)
    assert log2 is not None and [r.step for r in log2.rows] == [5]


def test_a_run_without_batches_journals_no_window() -> None:
    w = BatchWindow()
    w.observe(p.Received(t=1.0, attempt=1, rank=0, msg=p.Step(step=1, t=1.0, loss=2.0)))
    assert w.raised(_finding("LOSS_SPIKE"), attempt=1) is None


def test_the_read_model_keeps_the_newest_windows() -> None:
    st = RunState(run_id="r", argv=["x"], cwd="/", created=0.0)
    for i in range(BATCH_LOGS + 3):
        st.apply(p.BatchLog(t=float(i), code="LOSS_SPIKE", ident=f"LOSS_SPIKE/{i}", attempt=1))
    assert len(st.batch_logs) == BATCH_LOGS and st.batch_logs[-1].ident == f"LOSS_SPIKE/{BATCH_LOGS + 2}"


def test_the_sdk_takes_a_batch_as_a_dict_and_refuses_one_the_keeper_would() -> None:
    assert batch_ref({"epoch": 1, "index": 135, "seed": 42}) == p.BatchRef(epoch=1, index=135, seed=42)
    assert batch_ref({"ids": [3, 1, 4], "tag": "shard-17"}) == p.BatchRef(ids=[3, 1, 4], tag="shard-17")
    assert batch_ref({"index": -1}) is None
    assert batch_ref({"index": "7"}) is None
    assert batch_ref({"ids": list(range(1000))}) is None
    assert batch_ref({"shard": 3}) == p.BatchRef()  # an unknown key is ignored, as msgspec does
    # Over the wire a step keeps its batch.
    step = p.Step(step=3, t=1.0, loss=2.0, batch=p.BatchRef(index=3, seed=1))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(step), type=p.Step) == step


def test_the_replay_environment_round_trips() -> None:
    req = ReplayRequest(
        step=31,
        batch=p.BatchRef(seed=0, index=31),
        ckpt="/ck/step 30/x.pt",
        ckpt_step=30,
        batches={29: p.BatchRef(index=29)},
        fp32=True,
    )
    assert replay_request(replay_env(req)) == req
    assert replay_request({}) is None


def _st() -> RunState:
    return RunState(run_id="r", argv=["x"], cwd="/", created=0.0)


@pytest.mark.parametrize(
    ("recorded", "replayed", "ok", "words"),
    [
        (5.31, 5.31, True, "the spike at step 31 reproduces from the checkpoint before it"),
        (5.31, 2.6, False, "the spike at step 31 does not reproduce with the same batch"),
        (2.55, 2.55, False, "step 31 was no spike, so nothing reproduces"),
        # A NaN replay is no figure: never a reproduction, even of a NaN step.
        (math.nan, math.nan, False, "the replay gave nan: no figure, so never a reproduction"),
        (5.31, math.nan, False, "the replay gave nan"),
        (math.inf, math.inf, True, "reproduces"),
    ],
)
def test_the_verdict(recorded: float, replayed: float, ok: bool, words: str) -> None:
    got, said, figures = verdict(31, recorded, replayed, [2.6, 2.58, 2.62], _st(), fp32=False)
    assert got is ok and words in said
    assert figures["baseline"] == 2.6
