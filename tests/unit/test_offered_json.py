"""`status --json` names a finding's action only where it would act, as the control room offers
its key: EXPLODED_START's verify while nothing has verified, DEAD's resume with no verified
checkpoint, a keeper action once the keeper is gone, each become `action: null` with
`action_refused` saying why; where they act, they stay."""

from __future__ import annotations

from typing import Any

from tests.support.tui_fakes import T0, build_state, dead_run_records, healthy_records
from trainroom.core.actions.offered import KEEPER_GONE, offered_only
from trainroom.core.findings import Finding
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import finding_lines
from trainroom.core.wire import protocol as p


def _raised(code: str, t: float, action: str, **kw: Any) -> p.FindingRaised:
    return p.FindingRaised(
        finding=Finding(
            code=code,
            severity="warning",
            message=code.lower(),
            first_seen=t,
            last_seen=t,
            action=action,
            **kw,
        )  # type: ignore[arg-type]
    )


def _verified(step: int) -> p.CheckpointState:
    return p.CheckpointState(path=f"/ck/step-{step:06d}.pt", step=step, state="verified", t=T0 + step)


def test_verify_is_named_only_once_a_checkpoint_verified() -> None:
    recs = [*healthy_records(steps=30), _raised("EXPLODED_START", T0 + 1, "verify", evidence={"step": 1})]
    st = build_state(recs)
    d = offered_only(st, status_dict(st, now=T0 + 40))
    (f,) = [x for x in d["findings"] if x["code"] == "EXPLODED_START"]
    (row,) = [r for r in d["finding_rows"] if r["code"] == "EXPLODED_START"]
    for item in (f, row):
        assert item["action"] is None and item["action_refused"].startswith("no verified checkpoint")
    assert not any("[verify]" in line for line in finding_lines(d))
    st = build_state([*recs, _verified(20)])
    d = offered_only(st, status_dict(st, now=T0 + 40))
    (row,) = [r for r in d["finding_rows"] if r["code"] == "EXPLODED_START"]
    assert row["action"] == "verify" and "action_refused" not in row
    assert any(line.endswith("[verify]") for line in finding_lines(d))


def test_a_dead_run_names_its_resume_only_with_a_verified_checkpoint_and_reclaim_only_with_a_keeper() -> None:
    st = build_state(dead_run_records())  # the last verified checkpoint at step 300
    d = offered_only(st, status_dict(st, now=T0 + 400))
    assert next(r for r in d["finding_rows"] if r["code"] == "DEAD")["action"] == "resume"
    unverified = [
        r for r in dead_run_records() if not (isinstance(r, p.CheckpointState) and r.state == "verified")
    ]
    st = build_state(unverified)
    d = offered_only(st, status_dict(st, now=T0 + 400))
    dead = next(r for r in d["finding_rows"] if r["code"] == "DEAD")
    assert dead["action"] is None and dead["action_refused"].startswith(
        "no verified checkpoint to resume from"
    )
    # The keeper gone: a reclaim (the keeper's own action) is not named; a resume still is.
    st = build_state([*dead_run_records(), _raised("MASKED_ERROR", T0 + 260, "reclaim", key="attempt-1")])
    d = offered_only(st, status_dict(st, now=T0 + 400, keeper_alive=False), keeper_alive=False)
    acts = {f["code"]: (f["action"], f.get("action_refused")) for f in d["findings"]}
    assert acts["DEAD"] == ("resume", None)
    assert acts["MASKED_ERROR"] == (None, KEEPER_GONE)
