"""The fold of checkpoint records (run/state.py): a path saved over and over."""

from __future__ import annotations

from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p

T0 = 1_000_000.0


def test_a_verdict_on_an_older_version_of_a_path_saved_over_since_does_not_win() -> None:
    st = RunState(run_id="r", argv=["python"], cwd="/", created=T0)
    path = "/out/last.ckpt"

    def rec(state: str, step: int, t: float) -> None:
        st.apply(p.CheckpointState(path=path, step=step, state=state, t=t))

    rec("candidate", 60, T0 + 1)
    rec("verifying", 60, T0 + 2)
    rec("candidate", 80, T0 + 3)  # saved over while the step-60 version was being verified
    rec("verified", 60, T0 + 4)  # ... whose verdict comes in now
    c = st.checkpoint(path)
    assert c is not None and (c.step, c.state) == (80, "candidate")  # the newer one still waits
    rec("verifying", 80, T0 + 5)
    rec("verified", 80, T0 + 6)
    assert (c.step, c.state) == (80, "verified")
    # A later version's verdict, and one for the same step (a re-verification), are taken.
    rec("candidate", 100, T0 + 7)
    rec("rejected", 100, T0 + 8)
    assert (c.step, c.state) == (100, "rejected")
