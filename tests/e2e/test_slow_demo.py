"""`trainroom demo --fault slow` with a real keeper: from the fault step each batch waits 0.4 s (a
data loader gone slow); the steps keep coming, each several times the median, and the keeper says
`slow` with SLOW, the interval and the factor in words; `status` says the same."""

from __future__ import annotations

from pathlib import Path

from tests.support.helpers import run_cli, start_demo, status_json
from tests.support.waiting import wait_for


def test_the_slow_demo_raises_slow_while_its_steps_still_come(trhome: Path) -> None:
    info = start_demo(fault="slow", fault_step=20, step_delay=0.02)
    d = wait_for(
        lambda: (s := status_json(info.run_id)) and any(f["code"] == "SLOW" for f in s["findings"]) and s,
        timeout=180,
        what="SLOW after the fault step",
    )
    slow = next(f for f in d["findings"] if f["code"] == "SLOW")
    assert d["state"] == "slow", d["state"]
    assert d["step"] >= 20 and slow["severity"] == "warning"
    assert "SLOW" in run_cli("status", info.run_id).stdout
    # Still stepping: a later status has a later step.
    wait_for(lambda: status_json(info.run_id)["step"] > d["step"], timeout=60, what="steps still coming")
