"""The fold keeps what cleared: a resume clears DEAD, and the history still says it was there."""

from __future__ import annotations

from trainroom.core.findings import Finding
from trainroom.core.run.handlers.findings import RESOLVED
from trainroom.core.run.state import RunState, from_snapshot, to_snapshot
from trainroom.core.wire import protocol as p


def _state() -> RunState:
    return RunState(run_id="r", argv=["python", "train.py"], cwd="/w", created=0.0)


def _raised(code: str, t: float, key: str = "") -> p.FindingRaised:
    return p.FindingRaised(
        finding=Finding(code=code, severity="critical", message=f"{code} at {t}", key=key, first_seen=t)
    )


def test_a_cleared_finding_moves_to_the_history_with_when_it_cleared() -> None:
    st = _state()
    st.apply(_raised("DEAD", 10.0))
    st.apply(_raised("RANK_OUTLIER", 11.0, key="1"))
    st.apply(p.FindingCleared(ident="DEAD", t=20.0))
    assert list(st.findings) == ["RANK_OUTLIER:1"]
    (r,) = st.resolved
    assert r.finding.code == "DEAD" and r.finding.message == "DEAD at 10.0" and r.cleared_at == 20.0
    # An ident that is not open clears nothing and adds nothing.
    st.apply(p.FindingCleared(ident="DEAD", t=21.0))
    assert len(st.resolved) == 1
    # The history travels in the snapshot a client gets.
    again = from_snapshot(to_snapshot(st))
    assert again.resolved[0].finding.code == "DEAD" and again.resolved[0].cleared_at == 20.0


def test_the_history_is_bounded_newest_last() -> None:
    st = _state()
    for i in range(RESOLVED + 7):
        st.apply(_raised("LOSS_SPIKE", float(i), key=str(i)))
        st.apply(p.FindingCleared(ident=f"LOSS_SPIKE:{i}", t=i + 0.5))
    assert len(st.resolved) == RESOLVED
    assert st.resolved[-1].finding.key == str(RESOLVED + 6) and st.resolved[0].finding.key == "7"
