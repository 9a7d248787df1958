"""The fold of open findings into rows: a consequence under its open cause with a count, repeats
of one code as one row with a count and the newest, the root cause first."""

from __future__ import annotations

import random
from typing import Any

from trainroom.core.findings import Finding
from trainroom.core.run.causes import counted, fold
from trainroom.core.vocab import CATALOGUE, FINDING_CODES, FOLLOWS

T0 = 1_700_000_000.0


def f(code: str, t: float, key: str = "", severity: str | None = None, **evidence: Any) -> Finding:
    sev = severity or CATALOGUE[code].severity  # type: ignore[index]
    return Finding(
        code=code,  # type: ignore[arg-type]
        severity=sev,  # type: ignore[arg-type]
        key=key,
        message=f"{code} {key}".strip(),
        first_seen=t,
        last_seen=t,
        evidence=evidence,
    )


def nan_run(rejected: int = 14) -> list[Finding]:
    out = [f("NONFINITE", T0 + 31, step=31, field="loss")]
    out += [
        f("CKPT_REJECTED", T0 + 40 + i, key=f"step-{40 + 5 * i}.pt", nonfinite={"w": {"nan": 1}})
        for i in range(rejected)
    ]
    return out


def test_the_rejected_checkpoints_of_a_nan_model_are_one_line_under_nonfinite() -> None:
    rows = fold(nan_run())
    assert len(rows) == 1
    (row,) = rows
    assert row.cause.code == "NONFINITE" and row.cause.count == 1
    (k,) = row.consequences
    assert k.code == "CKPT_REJECTED" and k.count == 14
    assert row.since(k) == "14 checkpoints rejected since NONFINITE at step 31"
    # The newest rejection is the one the line names.
    assert k.head.key == "step-105.pt" and row.consequence_line(k).endswith("CKPT_REJECTED step-105.pt")
    assert len(row.idents) == 15 and row.head.code == "NONFINITE"


def test_repeats_of_one_code_are_one_row_with_a_count_and_the_newest() -> None:
    orphans = [f("ORPHAN_CONTEXT", T0 + i, key=f"pid-{100 + i}") for i in range(3)]
    rows = fold([*orphans, f("DISK_HIGH", T0 + 1)])
    assert [r.cause.code for r in rows] == ["ORPHAN_CONTEXT", "DISK_HIGH"]
    o = rows[0].cause
    assert o.count == 3 and o.head.key == "pid-102" and not rows[0].consequences
    assert o.said() == "3 GPU contexts left behind; the latest: ORPHAN_CONTEXT pid-102"
    assert rows[1].cause.said() == "DISK_HIGH"  # one finding says its own words


def test_a_consequence_whose_cause_is_closed_stands_alone() -> None:
    rejected = nan_run(3)[1:]
    rows = fold(rejected)
    assert [(r.cause.code, r.cause.count, r.consequences) for r in rows] == [("CKPT_REJECTED", 3, ())]


def test_a_rejection_for_another_reason_is_not_folded_under_nonfinite() -> None:
    # A truncated save is not the NaN's doing: it stays a row of its own.
    short = f("CKPT_REJECTED", T0 + 50, key="step-50.pt", problems=["size 10 bytes, 900 recorded"])
    rows = fold([*nan_run(2), short])
    nf = next(r for r in rows if r.cause.code == "NONFINITE")
    assert nf.consequences[0].count == 2
    alone = next(r for r in rows if r.cause.code == "CKPT_REJECTED")
    assert alone.cause.findings == (short,)


def test_the_root_cause_is_followed_through_a_chain() -> None:
    # The LR far from the one asked for, the loss climbing, then NaN, then NaN checkpoints:
    # one row, the LR first.
    fs = [f("LR_MISMATCH", T0), f("DIVERGENCE", T0 + 5), *nan_run(2)]
    (row,) = fold(fs)
    assert row.cause.code == "LR_MISMATCH"
    assert [k.code for k in row.consequences] == ["DIVERGENCE", "NONFINITE", "CKPT_REJECTED"]
    # The row is as severe as its worst finding, so a warning's row sorts with the critical ones.
    assert row.severity == "critical"
    assert row.since(row.consequences[2]) == "2 checkpoints rejected since LR_MISMATCH"


def test_a_number_seen_before_its_cause_is_not_its_doing() -> None:
    grad_first = fold([f("GRAD_EXPLOSION", T0), f("LOSS_SPIKE", T0 + 1)])
    spike_first = fold([f("GRAD_EXPLOSION", T0 + 1), f("LOSS_SPIKE", T0)])
    assert [(r.cause.code, [k.code for k in r.consequences]) for r in grad_first] == [
        ("GRAD_EXPLOSION", ["LOSS_SPIKE"])
    ]
    # The loss spiked first: the gradients that exploded after it are its consequence, never
    # the other way round.
    assert [(r.cause.code, [k.code for k in r.consequences]) for r in spike_first] == [
        ("LOSS_SPIKE", ["GRAD_EXPLOSION"])
    ]
    # A rejected NaN checkpoint seen before NONFINITE opened stands alone.
    early = f("CKPT_REJECTED", T0, key="step-5.pt", nonfinite={"w": {"nan": 1}})
    rows = fold([early, *nan_run(1)])
    assert sorted((r.cause.code, r.cause.count, len(r.consequences)) for r in rows) == [
        ("CKPT_REJECTED", 1, 0),
        ("NONFINITE", 1, 1),
    ]


def test_unrelated_findings_keep_the_order_of_every_client() -> None:
    fs = [f("STALE_LOCK", T0), f("DISK_HIGH", T0 + 2), f("LOSS_SPIKE", T0 + 3)]
    assert [r.cause.code for r in fold(fs)] == ["DISK_HIGH", "STALE_LOCK", "LOSS_SPIKE"]
    assert fold([]) == []


def test_a_lock_held_by_the_dead_is_the_cause_of_the_hang() -> None:
    (row,) = fold([f("HUNG", T0 + 10), f("STALE_LOCK", T0 + 20), f("SLOW", T0 + 5)])
    assert row.cause.code == "STALE_LOCK"
    assert {k.code for k in row.consequences} == {"HUNG", "SLOW"}


def test_the_links_name_codes_of_the_catalogue_and_no_one_way_cycle() -> None:
    for code, links in FOLLOWS.items():
        assert code in FINDING_CODES and all(link.cause in FINDING_CODES for link in links)
        assert all(link.cause != code for link in links)
        # A code told apart by its evidence is never itself a cause (it folds finding by finding).
        if any(link.shown_by for link in links):
            assert all(code != other.cause for ls in FOLLOWS.values() for other in ls)

    # Following the links that hold in any order never comes back to where it began (those
    # that hold only after the cause cannot: their time order is strict).
    def up(code: str) -> set[str]:
        return {link.cause for link in FOLLOWS.get(code, ()) if not link.after}  # type: ignore[call-overload]

    for start in FOLLOWS:
        seen: set[str] = set()
        todo = list(up(start))
        while todo:
            c = todo.pop()
            assert c != start, f"{start} follows itself through {seen}"
            if c not in seen:
                seen.add(c)
                todo += up(c)


def test_counts_in_words() -> None:
    assert counted("CKPT_REJECTED", 1) == "1 checkpoint rejected"
    assert counted("SLOW", 1) == "SLOW" and counted("SLOW", 2) == "2 × SLOW"


def test_a_rejection_never_speaks_of_a_verified_checkpoint_that_does_not_exist() -> None:
    from trainroom.core.ckpt.report import VerifyReport
    from trainroom.core.ckpt.rules import rejected_finding

    rep = VerifyReport(ok=False, reason="non-finite values", path="/r/.quarantine/step-000015.pt", step=15)
    none_yet = rejected_finding(rep, None)
    some = rejected_finding(rep, "step 10")
    assert none_yet is not None and some is not None
    assert "no checkpoint has verified yet: there is none to resume from" in none_yet.message
    assert "left as it was" not in none_yet.message and "last verified" not in none_yet.message
    assert some.message.endswith("`latest` is left as it was, at the last verified checkpoint (step 10)")


def test_a_run_s_summary_names_the_root_cause_for_the_runs_overview() -> None:
    from tests.support.tui_fakes import build_state, healthy_records
    from trainroom.core.run.summary import summarize
    from trainroom.core.wire import protocol as p

    recs = healthy_records(steps=5) + [p.FindingRaised(finding=x) for x in nan_run(3)]
    s = summarize(build_state(recs))
    assert s.findings == 4 and s.worst is not None and s.worst.code == "NONFINITE"


# ---------------------------------------------------------------- causes in time order


def diverge_run() -> list[Finding]:
    """What `demo --fault diverge --eval` opens, in the order the keeper saw it: the LR ran away at
    step 78, the loss spiked at 101, the checkpoint of step 100 was held back by its evaluation
    (seen after the spike), the gradients exploded at 134, the loss diverged, and the checkpoints
    from 150 on were rejected as exploded; the gradient finding has recovered (info)."""
    return [
        f("LR_RUNAWAY", T0 + 4.6, step=78),
        f("LOSS_SPIKE", T0 + 6.0, step=101),
        f("EVAL_REGRESSED", T0 + 6.3, key="step-100", step=100),
        f("GRAD_EXPLOSION", T0 + 8.2, severity="info", step=134),
        f("DIVERGENCE", T0 + 8.5),
        *(
            f("CKPT_REJECTED", T0 + 9 + i, key=f"s{s}", step=s, outliers={"w": 1})
            for i, s in enumerate((150, 200))
        ),
    ]


def test_a_runaway_lr_that_came_first_is_the_root_of_everything_after_it() -> None:
    (row,) = fold(diverge_run())
    assert row.cause.code == "LR_RUNAWAY"
    assert [k.code for k in row.consequences] == [
        "EVAL_REGRESSED",
        "LOSS_SPIKE",
        "GRAD_EXPLOSION",
        "DIVERGENCE",
        "CKPT_REJECTED",
    ]
    assert row.severity == "critical"
    assert row.since(row.consequences[4]) == "2 checkpoints rejected since LR_RUNAWAY at step 78"


def test_a_consequence_never_folds_under_a_cause_that_began_after_it_by_step() -> None:
    # Without the runaway LR: the evaluation of step 100 was *seen* after the spike of step 101,
    # but its checkpoint was saved before it: not the spike's doing, whatever the clock says.
    fs = [x for x in diverge_run() if x.code != "LR_RUNAWAY"]
    rows = fold(fs)
    by_code = {r.cause.code: r for r in rows}
    assert "EVAL_REGRESSED" in by_code and not by_code["EVAL_REGRESSED"].consequences
    spike = by_code["LOSS_SPIKE"]
    assert {k.code for k in spike.consequences} == {"GRAD_EXPLOSION", "DIVERGENCE", "CKPT_REJECTED"}
    # DIVERGENCE names no step: its first sighting (after the spike's) places it.
    assert spike.since(next(k for k in spike.consequences if k.code == "DIVERGENCE")).endswith(
        "since LOSS_SPIKE at step 101"
    )


def test_of_the_causes_that_began_before_it_a_consequence_takes_the_earliest() -> None:
    # exploded-init: the first loss exploded at step 1; the divergence and the rejection of an
    # exploded tensor come later. The rejection is the exploded start's, not the divergence's.
    fs = [
        f("EXPLODED_START", T0 + 1, step=1),
        f("DIVERGENCE", T0 + 20),
        f("CKPT_REJECTED", T0 + 30, key="s50", step=50, outliers={"w": 1}),
    ]
    rows = fold(fs)
    start = next(r for r in rows if r.cause.code == "EXPLODED_START")
    assert [k.code for k in start.consequences] == ["CKPT_REJECTED"]
    # A WARN root over a CRIT consequence: the row is CRIT, and leads.
    assert start.severity == "critical" and rows[0] is start


def test_a_row_is_as_severe_as_the_worst_it_holds_even_when_its_cause_recovered() -> None:
    fs = [
        f("GRAD_EXPLOSION", T0 + 1, severity="info", step=134),
        f("CKPT_REJECTED", T0 + 5, key="s150", step=150, outliers={"w": 1}),
    ]
    (row,) = fold(fs)
    assert row.cause.code == "GRAD_EXPLOSION" and row.cause.severity == "info"
    assert row.severity == "critical"


# The codes that take part in a cause or a consequence, where the fold has any choice to make.
_LINKED = sorted(set(FOLLOWS) | {link.cause for links in FOLLOWS.values() for link in links})


def test_every_open_finding_is_in_exactly_one_row_led_by_its_own_code() -> None:
    """Whatever the steps and sightings (steps and times that disagree included), each row's
    cause is a finding of the row's own code and every finding shows once (seeded draws)."""
    rng = random.Random(37)
    for _ in range(500):
        drawn = [
            (rng.choice(_LINKED), rng.randrange(4), rng.choice([None, *range(6)]), rng.randrange(6))
            for _ in range(rng.randrange(13))
        ]
        _check_rows(drawn)


def _check_rows(drawn: list[tuple[str, int, int | None, int]]) -> None:
    fs = {}
    for code, key, step, seen in drawn:
        ev = {} if step is None else {"step": step}
        fs[(code, str(key))] = f(code, T0 + seen, str(key), **ev)
    rows = fold(fs.values())
    shown = [x.ident for r in rows for x in r.findings]
    assert sorted(shown) == sorted(x.ident for x in fs.values())
    for r in rows:
        assert all(x.code == r.cause.code for x in r.cause.findings)
        assert all(k.code != r.cause.code for k in r.consequences)
