"""Fixes in causal order, keys only where they act, with a real keeper and the demo's
masked-enomem trainer: a load that fails with ENOMEM behind `SystemError: readinto` kills attempt 1.

- With a verified checkpoint: the reclaim the cause needs comes before the resume, in `status`,
  `status --json` and the resume plan, which says what still stands in its way.
- With none: no `resume` is named anywhere (the keeper would refuse it), and `verify RUN` answers
  that there is nothing to verify yet, exit 1, not "bad input"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli, start_demo, status_json
from tests.support.waiting import wait_for


def _dead_with_masked(run_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (d := status_json(run_id))
            and d["state"] == "dead"
            and {"DEAD", "MASKED_ERROR"} <= {f["code"] for f in d["findings"]}
            and d
        ),
        timeout=120,
        what="attempt 1 dead with its MASKED_ERROR",
    )


def test_the_reclaim_an_enomem_death_needs_comes_before_its_resume(trhome: Path) -> None:
    info = start_demo(fault="masked-enomem", fault_step=14, step_delay=0.02, ckpt_every=5)
    wait_for(
        lambda: any(c["state"] == "verified" for c in status_json(info.run_id)["checkpoints"]),
        timeout=120,
        what="a verified checkpoint",
    )
    d = _dead_with_masked(info.run_id)
    rows = [r["code"] for r in d["finding_rows"]]
    assert rows.index("MASKED_ERROR") < rows.index("DEAD"), rows
    assert [r["action"] for r in d["finding_rows"][:2]] == ["reclaim", "resume"]
    out = run_cli("status", info.run_id)
    lines = [ln for ln in out.stdout.splitlines() if re.match(r"\s+CRITICAL (MASKED_ERROR|DEAD):", ln)]
    assert [ln.split()[1] for ln in lines] == ["MASKED_ERROR:", "DEAD:"], out.stdout
    assert lines[0].endswith("[reclaim]") and lines[1].endswith("[resume]"), lines
    # The plan (asked without --yes: shown, then refused for want of a terminal) says first what
    # stands in its way, with the RAM figures, and names the reclaim.
    plan = run_cli("resume", info.run_id)
    assert plan.returncode == 2 and "needs confirmation" in plan.stderr, plan.stderr
    said = plan.stdout.splitlines()
    assert said[1].startswith("  in its way: the last attempt died of ENOMEM hidden behind `SystemError`"), (
        said
    )
    assert re.search(r"now [\d.]+ \w?i?B available, the load needs [\d.]+ \w?i?B", said[1]), said
    assert "reclaim the page cache first (C)" in said[1]
    assert any(re.match(r"  host memory available: .+; the load needs ", s) for s in said), said


def test_a_dead_run_with_nothing_verified_names_no_resume_and_verify_says_so(trhome: Path) -> None:
    info = start_demo(fault="masked-enomem", fault_step=10, step_delay=0.02, ckpt_every=0)
    d = _dead_with_masked(info.run_id)
    dead = next(f for f in d["findings"] if f["code"] == "DEAD")
    row = next(r for r in d["finding_rows"] if r["code"] == "DEAD")
    for item in (dead, row):
        assert item["action"] is None, item
        assert item["action_refused"].startswith("no verified checkpoint to resume from"), item
    out = run_cli("status", info.run_id)
    assert "[resume]" not in out.stdout and "[reclaim]" in out.stdout, out.stdout
    v = run_cli("verify", info.run_id)
    assert v.returncode == 1, (v.returncode, v.stderr)
    assert "nothing to verify: no checkpoint has verified yet" in v.stderr, v.stderr
    assert "Traceback" not in v.stderr
