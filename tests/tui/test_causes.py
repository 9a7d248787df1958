"""Cause and consequence in the control room, through Pilot against the real app: the header
names the root cause, never a consequence while its cause is open; the rejected checkpoints of a
NaN model are one line under NONFINITE with their count; the cursor stays on its finding as new
rows arrive above it, and Enter opens that one; a tensor's name keeps its underscores."""

from __future__ import annotations

import re
from typing import Any

from tests.support.tui_fakes import T0, healthy_records, in_loop, make_app, screen_text, settle, until
from trainroom.core.findings import Finding
from trainroom.core.wire import protocol as p
from trainroom.tui.screens.finding import FindingDetail
from trainroom.tui.widgets.findings import FindingsPanel
from trainroom.tui.widgets.header import RunHeader

TENSOR = "model.layers.0.self_attn.q_proj.weight"


def raised(code: str, severity: str, message: str, t: float, **kw: Any) -> p.FindingRaised:
    return p.FindingRaised(
        finding=Finding(code=code, severity=severity, message=message, first_seen=t, last_seen=t, **kw)  # type: ignore[arg-type]
    )


def nonfinite(t: float = T0 + 6) -> p.FindingRaised:
    return raised(
        "NONFINITE",
        "critical",
        "loss is nan at step 31 on rank 0",
        t,
        evidence={"step": 31, "field": "loss", "module": "blocks.1.mlp.0"},
    )


def rejected(i: int, t: float) -> p.FindingRaised:
    step = 35 + 5 * i
    return raised(
        "CKPT_REJECTED",
        "critical",
        f"checkpoint step {step} (step-{step:06d}.pt) rejected: non-finite values in 1 tensor(s): {TENSOR}",
        t,
        key=f"/ck/.quarantine/step-{step:06d}.pt",
        action="verify",
        evidence={"step": step, "nonfinite": {TENSOR: {"nan": 16384, "inf": 0}}},
    )


def nan_run(n: int = 14) -> list[Any]:
    return [*healthy_records(steps=10), nonfinite(), *(rejected(i, T0 + 10 + i) for i in range(n))]


@in_loop
async def test_the_header_names_the_root_cause_and_the_rejections_fold_under_it(tmp_path) -> None:
    app, link, _ = make_app(str(tmp_path), nan_run())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        header = app.query_one(RunHeader)
        assert header.view is not None and header.view.worst_code == "NONFINITE" and header.view.more == 0
        text = screen_text(app)
        top = text.splitlines()[0]
        assert "NONFINITE" in top and "CKPT_REJECTED" not in top, top
        panel = app.query_one(FindingsPanel)
        assert panel.view is not None and [r.code for r in panel.view.open] == ["NONFINITE"]
        (row,) = panel.view.open
        assert row.follow[0].count == 14 and len(row.idents) == 15
        assert "↳ CRIT 14 checkpoints rejected since NONFINITE at step 31" in text
        assert panel.border_title == "findings (1)"
        # The cause closes: the rejections stand alone, one row with their count and the newest.
        link.push([p.FindingCleared(ident="NONFINITE", t=T0 + 60)])
        await until(pilot, lambda: header.view is not None and header.view.worst_code == "CKPT_REJECTED")
        await pilot.pause()
        (row,) = panel.view.open
        assert row.code == "CKPT_REJECTED" and row.count == 14 and not row.follow
        assert row.message.startswith("14 checkpoints rejected; the latest: checkpoint step 100 ")
        assert "CKPT_REJECTED  14 checkpoints rejected; the latest" in screen_text(app)


@in_loop
async def test_the_cursor_stays_on_its_finding_when_a_new_one_arrives_above_it(tmp_path) -> None:
    recs = [
        *healthy_records(steps=10),
        raised("DISK_HIGH", "critical", "the checkpoint disk is 95 % full", T0 + 5),
        raised("STALE_LOCK", "warning", "a lock held by pid 4 that is gone", T0 + 6),
    ]
    app, link, _ = make_app(str(tmp_path), recs)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(FindingsPanel)
        assert app.focused is panel  # the findings have the focus from the start
        # With the focus, the cursor is on a finding (the first), not on a place in the list.
        assert panel.selected == "DISK_HIGH"
        await pilot.press("j")
        assert panel.selected == "STALE_LOCK"
        link.push([raised("HOST_RAM_LOW", "critical", "2 % of memory left", T0 + 20)])
        await until(pilot, lambda: panel.view is not None and len(panel.view.open) == 3, "the new row")
        assert [r.code for r in panel.view.open] == ["HOST_RAM_LOW", "DISK_HIGH", "STALE_LOCK"]  # type: ignore[union-attr]
        row = panel.selected_row()
        assert row is not None and row.code == "STALE_LOCK"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, FindingDetail), "the detail")
        assert app.screen.row.code == "STALE_LOCK"  # type: ignore[attr-defined]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, FindingDetail), "the detail closing")
        # A finding that folds under a new cause takes the cursor with it to its cause's row.
        await pilot.press("k")
        assert panel.selected == "DISK_HIGH"
        link.push([raised("DISK_FULL_SOON", "critical", "full in 5 min", T0 + 30)])
        await until(
            pilot,
            lambda: panel.view is not None and len(panel.view.open) == 3 and bool(panel.view.open[1].follow),
        )
        row = panel.selected_row()
        assert row is not None and row.code == "DISK_HIGH"
        # The finding under the cursor closes: the cursor stays where it was, on the one now there.
        link.push([p.FindingCleared(ident="DISK_HIGH", t=T0 + 40)])
        await until(
            pilot, lambda: panel.view is not None and all(r.code != "DISK_HIGH" for r in panel.view.open)
        )
        row = panel.selected_row()
        assert row is not None and panel.selected in row.idents


@in_loop
async def test_the_detail_says_what_follows_and_keeps_a_tensors_underscores(tmp_path) -> None:
    app, _, _ = make_app(str(tmp_path), [*healthy_records(steps=10), rejected(0, T0 + 5)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")  # the findings have the focus from the start
        await until(pilot, lambda: isinstance(app.screen, FindingDetail), "the detail")
        await pilot.pause()
        text = screen_text(app)
        assert f"{TENSOR} nan 16384, inf 0" in text and "self attn" not in text
    app, _, _ = make_app(str(tmp_path), nan_run(3))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")  # the findings have the focus from the start
        await until(pilot, lambda: isinstance(app.screen, FindingDetail), "the detail")
        await pilot.pause()
        text = screen_text(app)
        assert "CRIT NONFINITE" in text and "what follows from it" in text
        assert "3 checkpoints rejected since NONFINITE at step 31" in text
        assert "checkpoint step 45 (step-000045.pt) rejected" in text


@in_loop
async def test_the_header_names_a_lost_gpu_with_its_device_and_the_death_folds_under_it(tmp_path) -> None:
    from tests.support.tui_fakes import dead_run_records

    lost = raised(
        "GPU_LOST",
        "critical",
        "GPU 0 (0000:3b:00.0, NVIDIA H100 80GB HBM3) fell off the bus (Xid 79, read from /dev/kmsg): ...",
        T0 + 299,
        key="0000:3b:00.0",
        evidence={"device": 0, "bus_id": "0000:3b:00.0", "xid": 79},
    )
    app, _link, _ = make_app(str(tmp_path), [*dead_run_records(), lost])
    async with app.run_test(size=(100, 24)) as pilot:
        await settle(app, pilot)
        header = app.query_one(RunHeader)
        assert header.view is not None and header.view.state == "dead"
        assert (header.view.worst_code, header.view.worst_where) == ("GPU_LOST", "GPU 0 (0000:3b:00.0)")
        top = screen_text(app).splitlines()[0]
        assert "DEAD" in top and "GPU_LOST GPU 0 (0000:3b:00.0)" in top, top
        panel = app.query_one(FindingsPanel)
        assert panel.view is not None and panel.view.open[0].code == "GPU_LOST"
        assert [f.code for f in panel.view.open[0].follow] == ["DEAD"]
        assert "DEAD" not in [r.code for r in panel.view.open]


def diverge_records() -> list[Any]:
    """`demo --fault diverge --eval` after the gradients came back in range: GRAD_EXPLOSION (from
    step 134) is INFO now, the checkpoints the exploded model saved are rejected (CRIT), the loss
    diverged and a checkpoint was held back by its evaluation, and the fp16 scaler halved."""
    recs: list[Any] = [
        *healthy_records(steps=10),
        raised(
            "GRAD_EXPLOSION",
            "info",
            "grad norm 2.5e+08 at step 176 (10^8), 4.81e+08x its median 0.5206 over the last 100 steps; "
            "back in range at step 495",
            T0 + 6,
            evidence={"step": 134},
        ),
        raised("DIVERGENCE", "warning", "rolling median loss 84.12 has stayed above the best", T0 + 7),
        raised("EVAL_REGRESSED", "warning", "checkpoint step 140 held back", T0 + 8, evidence={"step": 140}),
        raised("LOSS_SCALE", "warning", "the fp16 loss scale halved 3 times", T0 + 9),
    ]
    for i in range(8):
        step = 150 + 50 * i
        recs.append(
            raised(
                "CKPT_REJECTED",
                "critical",
                f"checkpoint step {step} (step-{step:06d}.pt) rejected: exploded tensor: lm_head.weight",
                T0 + 10 + i,
                key=f"/ck/.quarantine/step-{step:06d}.pt",
                evidence={"step": step, "outliers": {"lm_head.weight": 12.8}},
            )
        )
    return recs


@in_loop
async def test_a_row_is_as_severe_as_the_worst_it_holds_and_its_crit_lines_stay_in_view_at_80x24(
    tmp_path,
) -> None:
    from trainroom.core.run.causes import fold
    from trainroom.core.run.status import finding_row

    app, _, _ = make_app(str(tmp_path), diverge_records())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(FindingsPanel)
        assert panel.view is not None
        (row,) = panel.view.open
        # `status` and `status --json` say the row this way: the TUI says it the same.
        (want,) = [finding_row(r) for r in fold(app.state.open_findings())]
        assert want["severity"] == row.severity == "critical"
        text = screen_text(app)
        assert "CRIT GRAD_EXPLOSION" in text and "INFO GRAD_EXPLOSION" not in text, text
        rejected = next(k for k in want["consequences"] if k["code"] == "CKPT_REJECTED")
        assert rejected["since"] == "8 checkpoints rejected since GRAD_EXPLOSION at step 134"
        assert f"↳ CRIT {rejected['since']}" in text, text
        # Four consequences in a four-line panel: the CRIT one keeps its line, one line names the rest.
        assert "↳ +2 more: EVAL_REGRESSED, LOSS_SCALE" in text, text
    app, _, _ = make_app(str(tmp_path), diverge_records())
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        text = screen_text(app)
        for k in want["consequences"]:
            word = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}[k["severity"]]
            assert f"↳ {word} {k['since']}" in text, text


@in_loop
async def test_the_reclaim_an_enomem_death_needs_leads_the_findings_and_the_key_strip(tmp_path) -> None:
    from tests.support.tui_fakes import dead_run_records

    masked = raised(
        "MASKED_ERROR",
        "critical",
        "`SystemError: readinto` hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`; host RAM ran "
        "out: reclaim the page cache before a resume",
        T0 + 210,  # seen (as a warning) before the death it explains
        key="attempt-1",
        action="reclaim",
        evidence={"errno_name": "ENOMEM"},
    )
    app, _, _ = make_app(str(tmp_path), [*dead_run_records(), masked])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        panel = app.query_one(FindingsPanel)
        assert panel.view is not None
        # The host's RAM ran low (the fake's probe says so): the masked error folds under it, and
        # that row, whose fix the resume waits on, leads.
        assert [r.code for r in panel.view.open] == ["HOST_RAM_LOW", "DEAD"]
        assert [k.code for k in panel.view.open[0].follow] == ["MASKED_ERROR"]
        assert [r.key for r in panel.view.open] == ["C", "R"]
        strip = screen_text(app).splitlines()[-1]
        assert strip.lstrip().startswith("C reclaim  R resume"), strip


@in_loop
async def test_the_header_s_age_is_the_named_finding_s_not_the_state_s(tmp_path) -> None:
    # RUNNING since T0 (3m+ by `now`); the LR finding opened 11 s before `now`.
    now = T0 + 215
    lr = raised(
        "LR_MISMATCH", "warning", "effective LR 1e-06 vs requested 1e-04", now - 11, evidence={"step": 5}
    )
    app, _, _ = make_app(str(tmp_path), [*healthy_records(steps=10), lr], now=now)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        header = app.query_one(RunHeader)
        assert header.view is not None and header.view.worst_code == "LR_MISMATCH"
        assert header.view.worst_age_s is not None and 11 <= header.view.worst_age_s < 30
        assert header.view.state_age_s is not None and header.view.state_age_s > 60
        top = screen_text(app).splitlines()[0]
        assert re.search(r"RUNNING  LR_MISMATCH for 1\d s", top), top
