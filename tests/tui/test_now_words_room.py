"""The control room's findings say a volatile finding's figures of now (`run.nowwords`), as
`status` does: a STALLED row the gap since the last step, not the one it opened with."""

from __future__ import annotations

from tests.support.tui_fakes import T0, build_state, healthy_records, in_loop, make_app, screen_text, settle
from trainroom.core.findings import Finding
from trainroom.core.run.status import status_dict
from trainroom.core.wire import protocol as p


def stalled_records() -> list[object]:
    recs = healthy_records(steps=10)  # the last step at T0 + 5.5
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="STALLED",
                severity="critical",
                action="dump",
                first_seen=T0 + 16,
                last_seen=T0 + 200,  # the keeper's latest measurement (sent live, not journaled)
                message="alive, heartbeats flowing, no step for 10 s (no step within 10 s)",
                evidence={"cause": "no-step", "rank": 0, "gap_s": 195.0, "bound_s": 10.0, "last_step": 9},
            )
        )
    )
    return recs


@in_loop
async def test_a_stalled_row_says_the_gap_of_now(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), stalled_records(), now=T0 + 215)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = " ".join(screen_text(app).split())
        (row,) = [r for r in app.findings_now.open if r.code == "STALLED"]
    # 195 s measured at T0 + 200, 15 s ago: 3m30s.
    assert "no step for 3m30s" in text and "no step for 10 s" not in text
    assert row.message == "alive, heartbeats flowing, no step for 3m30s (no step within 10 s)"
    d = status_dict(build_state(stalled_records()), now=T0 + 215)
    assert [f["message"] for f in d["findings"] if f["code"] == "STALLED"] == [row.message]
