"""The rule registry (`health.rules`): every rule listed once under a unique part name, and any
one of them raising is an INTERNAL_ERROR naming it while every other rule of its group still
judges."""

from __future__ import annotations

import pytest

from tests.support.run_builder import RunBuilder
from trainroom.core import failpoints
from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health import rules
from trainroom.core.health.context import Memory, WatchContext
from trainroom.core.health.detectors import Detectors
from trainroom.core.health.guard import Guard
from trainroom.core.health.rules import KEEPER, SANITY, WATCHDOG, KeeperFacts, Rule, Watched, judge
from trainroom.core.health.sanity import SanityTracker
from trainroom.core.journal.file import JournalHealth
from trainroom.core.wire.protocol import RequestedConfig


def _watched() -> Watched:
    b = RunBuilder()
    b.start()
    b.steps(5)
    return Watched(run=b.run, ctx=WatchContext(alive=True), memory=Memory())


def _keeper(failing: bool) -> KeeperFacts:
    b = RunBuilder()
    b.start()
    return KeeperFacts(
        run=b.run,
        thresholds=Thresholds(),
        journal=JournalHealth(error="ENOSPC: No space left on device", since=1.0)
        if failing
        else JournalHealth(),
        journal_where="/runs/r",
        journal_backlog_bytes=1 << 20,
        state_disk=None,
        live_claims=[(1, 0, 100, 200)],
        refused_fields=[(1, 0, "step.tokens", "-1", "must be at least 0", False, 3)],
        checkpoints=lambda _now: [],
    )


def test_every_rule_is_listed_once() -> None:
    assert len(rules.ALL) == len(set(rules.ALL))
    assert rules.ALL[0] == "watchdog.state"
    assert {r.name.split(".")[0] for r in WATCHDOG} == {"watchdog"}
    assert {r.name.split(".")[0] for r in SANITY} == {"sanity"}


def test_judge_keeps_the_groups_order_and_drops_nones() -> None:
    a = Finding(code="A", severity="info", message="a")
    b = Finding(code="B", severity="info", message="b")
    group: tuple[Rule[int], ...] = (
        Rule("t.one", lambda seen, now: [None, a] if seen == 1 else []),
        Rule("t.two", lambda seen, now: [b, None]),
    )
    assert judge(Guard(), group, 1, 0.0) == [a, b]


def test_the_keeper_rules_judge_what_the_keeper_knows_of_itself() -> None:
    codes = [f.code for f in judge(Guard(), KEEPER, _keeper(failing=True), 2.0)]
    assert codes == ["JOURNAL_WRITE_FAILED", "RANK_CLAIMED", "FIELD_REFUSED"]
    assert judge(Guard(), KEEPER, _keeper(failing=False), 2.0)[0].code == "RANK_CLAIMED"


@pytest.mark.parametrize("name", [r.name for r in KEEPER])
def test_a_raising_keeper_rule_is_named_and_the_others_go_on(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.ENV, name)
    g = Guard()
    codes = {f.code for f in judge(g, KEEPER, _keeper(failing=True), 2.0)}
    assert set(g.faults) == {name}
    assert codes == {"JOURNAL_WRITE_FAILED", "RANK_CLAIMED", "FIELD_REFUSED"} - {
        {
            "keeper.journal": "JOURNAL_WRITE_FAILED",
            "keeper.rank_claims": "RANK_CLAIMED",
            "keeper.fields_refused": "FIELD_REFUSED",
        }.get(name, "")
    }
    (internal,) = g.findings(2.0)
    assert (internal.code, internal.key) == ("INTERNAL_ERROR", name)


@pytest.mark.parametrize("name", [r.name for r in WATCHDOG])
def test_a_raising_watchdog_rule_is_named(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, name)
    g = Guard()
    assert judge(g, WATCHDOG, _watched(), 10.0) == []
    assert set(g.faults) == {name}


@pytest.mark.parametrize("name", [r.name for r in SANITY])
def test_a_raising_sanity_rule_is_named_and_nonfinite_still_judges(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tr = SanityTracker()
    tr.start_attempt(RequestedConfig(), resumed=False, t=0.0)
    for i in range(5):
        tr.observe_step(0, i, float(i), loss=float("nan") if i == 4 else 2.0)
    d: Detectors = tr.detectors
    monkeypatch.setenv(failpoints.ENV, name)
    g = Guard()
    codes = {f.code for f in judge(g, SANITY, d, 5.0)}
    assert set(g.faults) == {name}
    assert ("NONFINITE" in codes) == (name != "sanity.nonfinite")
