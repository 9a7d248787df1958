"""Training sanity end to end (scenarios 4-8): the demo trainer's faults, made for real on
CPU torch, against a real keeper; each finding is read back from the journal the keeper wrote
(every FindingRaised) and from the status JSON, never from the tracker directly."""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli, series_of, start_demo, status, status_json
from tests.support.waiting import wait_for
from trainroom.core.demo.faults import EARLIER_RUN_LR
from trainroom.core.demo.launcher import demo_command, demo_dir, demo_options
from trainroom.core.health.sanity import CODES
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

SANITY = set(CODES)
START = 120.0  # torch import and the first step on a loaded 2-core machine: a bound, not a measure
RUN = 300.0


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _raised(info: runs.RunInfo, code: str | None = None) -> list[Any]:
    """Every finding the keeper raised (or re-raised with a new message), in journal order."""
    out = [r.finding for r in _journal(info) if isinstance(r, protocol.FindingRaised)]
    return [f for f in out if code is None or f.code == code]


def _finished(info: runs.RunInfo, timeout: float = RUN) -> dict[str, Any]:
    return wait_for(
        # The state and the attempt's exit are journaled a moment apart (under torchrun the
        # workers' ends come first): both, or the exit code reads null.
        lambda: (
            (s := status(info))["state"] in ("exited", "dead")
            and (s["exit"]["code"] is not None or s["exit"]["signal"] is not None)
            and s
        ),
        timeout=timeout,
        what="the trainer to finish",
    )


def _notes(info: runs.RunInfo, kind: str) -> list[protocol.Received]:
    return [
        r
        for r in _journal(info)
        if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Note) and r.msg.kind == kind
    ]


def _launch(fault: str, trainer_extra: list[str], **kw: Any) -> runs.RunInfo:
    """start_demo, with extra trainer flags appended to the demo's own command."""
    ns = argparse.Namespace(
        fault=fault,
        fault_step=kw.get("fault_step"),
        steps=kw.get("steps"),
        forever=kw.get("steps") is None,
        lr=kw.get("lr"),
        step_delay=kw.get("step_delay"),
        ckpt_every=kw.get("ckpt_every"),
        tracer=False,
        ranks=None,
        auto_resume=None,
        linger_s=None,
    )
    return launch(demo_command(ns) + trainer_extra, demo_options(ns), cwd=str(demo_dir()))


# ---------------------------------------------------------------------------- scenario 4: lr-override


def _earlier_run_then_resume(info: runs.RunInfo) -> dict[str, Any]:
    """Attempt 1 plays the earlier run at 1e-6: it saves at the fault step and ends. Once its
    checkpoint is verified, resume through the keeper as a user would (`trainroom resume --yes`)."""
    d = wait_for(
        lambda: (
            (s := status(info))["state"] == "exited"
            and any(c["state"] == "verified" for c in s["checkpoints"])
            and s
        ),
        timeout=RUN,
        what="the earlier run to end with a verified checkpoint",
    )
    assert d["attempt"] == 1 and d["step"] == 10
    assert d["lr"]["effective"] == [pytest.approx(EARLIER_RUN_LR)]
    assert d["lr"]["requested"] == pytest.approx(EARLIER_RUN_LR)  # it asked for what it ran at
    assert not _raised(info, "LR_MISMATCH")
    out = run_cli("resume", info.run_id, "--yes", "--json", timeout=RUN)
    assert out.returncode == 0, out.stdout + out.stderr
    # The attempt's own end, not the run state: that one still says "exited" (attempt 1) for a tick.
    wait_for(
        lambda: (s := status(info))["attempt"] == 2 and s["attempts"][1]["ended_at"] is not None,
        timeout=RUN,
        what="the resumed attempt to finish",
    )
    return wait_for(
        lambda: (s := status(info))["state"] in ("exited", "dead") and s,
        timeout=30,
        what="the run state after the resumed attempt",
    )


def test_lr_override_resume_raises_lr_mismatch_on_the_first_step_after_the_resume(trhome: Path) -> None:
    info = start_demo(fault="lr-override", steps=25, fault_step=10, lr=1e-4, ckpt_every=0, step_delay=0.01)
    d = _earlier_run_then_resume(info)
    assert d["exit"]["code"] == 0 and d["attempts"][1]["first_step"] == 11
    # Scenario 4's session: asked for 1e-4, trains at the restored 1e-6, and the keeper says so.
    assert d["lr"] == {"effective": [pytest.approx(1e-6)], "requested": pytest.approx(1e-4)}
    found = _raised(info, "LR_MISMATCH")
    assert found, [f.code for f in _raised(info)]
    f = found[0]
    assert f.evidence["step"] == 11 and f.evidence["resumed"] is True
    assert f.evidence["requested"] == pytest.approx(1e-4)
    assert f.evidence["effective"] == pytest.approx(1e-6)
    assert f.evidence["ratio"] == pytest.approx(0.01)
    for part in (
        "requested 0.0001",
        "1e-06",
        "ratio 0.01",
        "first step after the resume",
        "scheduler.load_state_dict",
        "base_lrs",
        "optimizer.load_state_dict",
        "initial_lr",
        "reimpose_lr",
    ):
        assert part in f.message, (part, f.message)
    # It stays open while the mismatch lasts, in what `trainroom status --json` prints.
    assert "LR_MISMATCH" in {x["code"] for x in status_json(info.run_id)["findings"]}
    assert not _notes(info, "lr-reimposed")
    # The series reached the snapshot: both attempts' points, a restart mark, the checkpoint mark.
    series = wait_for(
        lambda: (s := series_of(info)).get("total_points", 0) >= 25 and s,
        timeout=30,
        what="the series of both attempts in the snapshot",
    )
    kinds = [m["kind"] for m in series["marks"]]
    assert "restart" in kinds and "checkpoint" in kinds, series["marks"]
    assert any(v is not None for v in series["loss"]["hi"])
    assert series["loss_baseline"] == pytest.approx(math.log(d["vocab_size"]))


def test_lr_override_resume_through_reimpose_lr_raises_none(trhome: Path) -> None:
    info = _launch(
        "lr-override", ["--reimpose-lr"], steps=25, fault_step=10, lr=1e-4, ckpt_every=0, step_delay=0.01
    )
    d = _earlier_run_then_resume(info)
    assert d["exit"]["code"] == 0
    assert d["lr"] == {"effective": [pytest.approx(1e-4)], "requested": pytest.approx(1e-4)}
    assert not _raised(info, "LR_MISMATCH")
    notes = _notes(info, "lr-reimposed")
    assert len(notes) == 1 and notes[0].attempt == 2
    groups = notes[0].msg.data["groups"]
    assert groups == [{"group": 0, "old": pytest.approx(1e-6), "new": pytest.approx(1e-4)}]
    series = wait_for(
        lambda: (s := series_of(info)).get("total_points", 0) >= 25 and s,
        timeout=30,
        what="the series of both attempts in the snapshot",
    )
    kinds = [m["kind"] for m in series["marks"]]
    assert "restart" in kinds and "lr-change" in kinds, series["marks"]


# ---------------------------------------------------------------------------- scenarios 5, 6: ln V


def test_exploded_init_raises_exploded_start_on_the_first_step(trhome: Path) -> None:
    info = start_demo(fault="exploded-init", steps=15, ckpt_every=0)
    d = _finished(info)
    found = _raised(info, "EXPLODED_START")
    assert found, [f.code for f in _raised(info)]
    ev = found[0].evidence
    assert ev["step"] == 1 and ev["vocab_size"] == d["vocab_size"]
    assert ev["ln_v"] == pytest.approx(math.log(d["vocab_size"]))
    assert ev["first_loss"] > 2 * ev["ln_v"]
    assert found[0].action == "verify"


def test_white_model_raises_white_model_within_50_steps_on_the_plateau(trhome: Path) -> None:
    info = start_demo(fault="white-model", steps=60, ckpt_every=0)
    d = _finished(info)
    found = _raised(info, "WHITE_MODEL")
    assert found, [f.code for f in _raised(info)]
    ev = found[0].evidence
    lnv = math.log(d["vocab_size"])
    assert ev["ln_v"] == pytest.approx(lnv) and ev["loss"] == pytest.approx(lnv, rel=0.02)
    assert ev["since_step"] == 1 and ev["steps"] >= 50  # raised on the plateau's 50th step, not before
    assert ev["geo_mean_p"] == pytest.approx(1 / d["vocab_size"], rel=0.05)
    assert "e^-L" in found[0].message
    assert not {"EXPLODED_START", "LR_MISMATCH"} & {f.code for f in _raised(info)}
    # ln V is drawn on the loss plot.
    assert wait_for(lambda: series_of(info).get("loss_baseline"), timeout=30) == pytest.approx(lnv)


# ---------------------------------------------------------------------------- scenario 7


def test_spike_raises_loss_spike_the_step_it_happens_and_sees_it_recover(trhome: Path) -> None:
    info = start_demo(fault="spike", steps=60, fault_step=30, ckpt_every=0)
    _finished(info)
    found = _raised(info, "LOSS_SPIKE")
    assert found, [f.code for f in _raised(info)]
    ev = found[-1].evidence
    assert ev["step"] == 31 and ev["size_nats"] > 1.0  # the step after the weights went bad
    assert ev["recovered"] and ev["recovered_step"] > 31
    assert "recovered after" in found[-1].message
    assert not {"NONFINITE", "DIVERGENCE", "EXPLODED_START"} & {f.code for f in _raised(info)}


def test_diverge_raises_spike_then_divergence_while_still_finite(trhome: Path) -> None:
    info = start_demo(fault="diverge", steps=210, fault_step=30, ckpt_every=0)
    _finished(info)
    raised = _raised(info)
    order = [f.code for f in raised]
    assert "LOSS_SPIKE" in order and "DIVERGENCE" in order, order
    assert order.index("LOSS_SPIKE") < order.index("DIVERGENCE")
    div = next(f for f in raised if f.code == "DIVERGENCE")
    assert div.evidence["median"] > div.evidence["best"] + div.evidence["band"]
    assert div.evidence["since_step"] > 30  # after the LR left its stable range, not before
    # The loss was still finite when DIVERGENCE fired: "wait for NaN" would have been late.
    nonfinite = [f for f in raised if f.code == "NONFINITE"]
    assert not nonfinite or raised.index(nonfinite[0]) > raised.index(div)


def test_nan_raises_nonfinite_naming_the_module_with_the_tracer_on(trhome: Path) -> None:
    info = start_demo(fault="nan", steps=30, fault_step=20, ckpt_every=0, tracer=True)
    _finished(info)
    notes = _notes(info, "nonfinite-module")
    assert len(notes) == 1 and notes[0].msg.data["module"] == "blocks.1.mlp.0" and notes[0].msg.step == 21
    found = [f for f in _raised(info, "NONFINITE") if "module" in f.evidence]
    assert found, [(f.code, f.message) for f in _raised(info)]
    ev = found[0].evidence
    assert ev["step"] == 21 and ev["field"] == "loss" and ev["module"] == "blocks.1.mlp.0"
    assert "first non-finite module: blocks.1.mlp.0" in found[0].message
    assert found[0].severity == "critical"
    j = status_json(info.run_id)
    assert "NONFINITE" in {f["code"] for f in j["findings"]}
    # Strict JSON: a NaN loss is null, with the raw value beside it.
    assert j["loss"] is None and j["loss_raw"] == "nan"
    assert j["loss_worst"] == {"rank": 0, "loss": None, "loss_raw": "nan"}


# ---------------------------------------------------------------------------- scenario 8: ranks


def test_rank_outlier_under_torchrun_names_rank_1_and_the_headline_is_the_median(trhome: Path) -> None:
    info = start_demo(fault="rank-outlier", ranks=2, steps=45, fault_step=20, ckpt_every=0, step_delay=0.01)
    _finished(info)
    found = _raised(info, "RANK_OUTLIER")
    assert found, [f.code for f in _raised(info)]
    assert {f.evidence["rank"] for f in found} == {1}
    assert all(f.evidence["metric"] == "loss" and f.evidence["step"] > 20 for f in found)
    assert "rank 1 loss" in found[0].message and "the median of the other rank" in found[0].message
    j = status_json(info.run_id)
    losses = {r["rank"]: r["loss"] for r in j["ranks"]}
    assert set(losses) == {0, 1} and losses[1] > losses[0] + 0.5
    assert j["loss"] == pytest.approx(statistics.median(losses.values()))
    assert j["loss_worst"] == {"rank": 1, "loss": pytest.approx(losses[1])}
    assert "RANK_OUTLIER" in {f["code"] for f in j["findings"]}


# ---------------------------------------------------------------------------- healthy runs


def test_healthy_2000_step_demo_raises_no_sanity_finding(trhome: Path) -> None:
    info = start_demo(steps=2000, ckpt_every=1000)
    d = _finished(info, timeout=600)
    assert d["exit"]["code"] == 0 and d["step"] == 2000
    raised = _raised(info)
    assert not {f.code for f in raised} & SANITY, [(f.code, f.message) for f in raised if f.code in SANITY]
    assert d["loss"] < math.log(d["vocab_size"]) * 0.75  # it did learn
    series = wait_for(
        lambda: (s := series_of(info)).get("total_points") == 2000 and s,
        timeout=30,
        what="all 2000 points in the snapshot's series",
    )
    assert 0 < len(series["points"]) <= 2000 and sum(series["points"]) == 2000
    kinds = {m["kind"] for m in series["marks"]}
    assert "lr-change" in kinds  # the StepLR milestone at step 1000, marked on the curve


def test_healthy_two_rank_torchrun_demo_raises_no_sanity_finding(trhome: Path) -> None:
    info = start_demo(ranks=2, steps=150, ckpt_every=0)
    d = _finished(info)
    assert d["exit"]["code"] == 0
    raised = _raised(info)
    assert not {f.code for f in raised} & SANITY, [(f.code, f.message) for f in raised if f.code in SANITY]
    losses = {r["rank"]: r["loss"] for r in d["ranks"]}
    assert set(losses) == {0, 1} and all(r["step"] == 150 for r in d["ranks"])
    worst = max(losses, key=lambda r: losses[r])
    assert d["loss"] == pytest.approx(statistics.median(losses.values()))
    assert d["loss_worst"] == {"rank": worst, "loss": pytest.approx(losses[worst])}
