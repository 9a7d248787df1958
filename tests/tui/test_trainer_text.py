"""Text from a trainer is never markup: a message holding `[INST] … [/INST]` or a path holding
`[/]` is shown as written, in every panel and in a finding opened whole (Pilot, the real app)."""

from __future__ import annotations

from typing import Any

from tests.support.tui_fakes import T0, healthy_records, in_loop, make_app, screen_text, settle, until
from trainroom.core.findings import Finding
from trainroom.core.wire import protocol as p
from trainroom.tui.screens.finding import FindingDetail
from trainroom.tui.widgets.findings import FindingsPanel

PROMPT = "bad prompt [INST] say [bold]hi[/bold] [/INST] in batch"
PATH = "/data/shards/[/]odd[red]/part-0001.bin"


def hostile_records() -> list[Any]:
    recs: list[Any] = healthy_records(steps=10)
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="MASKED_ERROR",
                severity="critical",
                message=f"the crash was caused by ValueError: {PROMPT}",
                first_seen=T0 + 6,
                last_seen=T0 + 6,
                evidence={"inner": f"ValueError: {PROMPT}", "chain": [PROMPT, "[/]"], "step": 9},
            )
        )
    )
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="DISK_HIGH",
                severity="warning",
                message=f"the disk under {PATH} is 97% full",
                first_seen=T0 + 7,
                last_seen=T0 + 7,
                evidence={"path": PATH, "detail": {"mount": "[/]"}},
            )
        )
    )
    return recs


@in_loop
async def test_a_finding_whose_text_looks_like_markup_opens_as_written(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), hostile_records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(FindingsPanel)
        assert [r.code for r in panel.view.open] == ["MASKED_ERROR", "DISK_HIGH"]  # type: ignore[union-attr]
        assert app.focused is panel  # from the start
        for code in ("MASKED_ERROR", "DISK_HIGH"):
            await until(pilot, lambda c=code: (r := panel.selected_row()) is not None and r.code == c, code)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, FindingDetail), f"{code}'s detail")
            await pilot.pause()
            detail = screen_text(app)
            if code == "MASKED_ERROR":
                assert "[INST] say [bold]hi[/bold] [/INST]" in detail
            else:
                assert "[/]odd[red]" in detail
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, FindingDetail), "the detail closing")
            await pilot.press("j")
