"""Rule isolation: a part that raises is an INTERNAL_ERROR finding and every other part keeps
judging (DEAD above all); failpoints switch faults on by name."""

from __future__ import annotations

import pytest

from tests.support.run_builder import RunBuilder
from trainroom.core import failpoints
from trainroom.core.health import rules as rules_mod
from trainroom.core.health import watchdog as watchdog_mod
from trainroom.core.health.context import WatchContext
from trainroom.core.health.guard import HOLD_S, Fault, Guard
from trainroom.core.health.sanity import SanityTracker
from trainroom.core.health.watchdog import Watchdog
from trainroom.core.probes.sweep import ProbeSweep, ProbeTargets
from trainroom.core.wire.protocol import RequestedConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _boom() -> list[object]:
    return [1 / 0]


def test_a_raising_part_returns_its_default_and_becomes_an_internal_error() -> None:
    clock, seen = Clock(), []
    g = Guard(seen.append, clock=clock)
    assert g.call("rule.a", _boom, ["default"]) == ["default"]
    assert g.call("rule.b", lambda: ["fine"], []) == ["fine"]
    (f,) = g.findings(clock.t)
    assert (f.code, f.key, f.severity) == ("INTERNAL_ERROR", "rule.a", "warning")
    assert "ZeroDivisionError" in f.message and "rule.a" in f.message
    assert [x.name for x in seen] == ["rule.a"]
    assert "Traceback" in seen[0].traceback and "_boom" in seen[0].traceback


def test_a_part_raising_every_tick_is_journaled_at_powers_of_ten_with_the_same_words() -> None:
    clock, counts = Clock(), []
    g = Guard(lambda f: counts.append(f.count), clock=clock)
    words = set()
    for _ in range(120):
        clock.t += 0.25
        g.call("rule.a", _boom, None)
        words.add(g.findings(clock.t)[0].message)
    assert counts == [1, 10, 100]
    assert len(words) == 1  # the keeper journals a finding again only when its words change
    assert g.findings(clock.t)[0].evidence["count"] == 120


def test_the_finding_closes_hold_s_after_the_last_fault() -> None:
    clock = Clock()
    g = Guard(clock=clock)
    g.call("rule.a", _boom, None)
    clock.t += HOLD_S - 1
    assert g.findings(clock.t)
    clock.t += 2
    assert g.findings(clock.t) == []


def test_a_raising_rule_leaves_dead_and_every_other_rule_working(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> list[object]:
        raise KeyError("holders")

    monkeypatch.setattr(rules_mod, "stale_locks", broken)
    b = RunBuilder()
    b.start()
    b.steps(20)
    b.end(exit_signal=9)
    wd = Watchdog()
    v = wd.evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "dead" and "DEAD" in {f.code for f in v.findings}
    # The guard's findings travel beside the verdict (the keeper adds them once for every part).
    (internal,) = wd.guard.findings(b.now)
    assert internal.key == "watchdog.locks" and "KeyError" in internal.message


def test_a_raising_state_rule_still_calls_a_killed_trainer_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> object:
        raise RuntimeError("state rule bug")

    monkeypatch.setattr(watchdog_mod, "ended_verdict", broken)
    b = RunBuilder()
    b.start()
    b.steps(20)
    wd = Watchdog()
    assert wd.evaluate(b.run, WatchContext(alive=True), b.now).state == "running"
    b.end(exit_signal=9)
    v = wd.evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "dead" and "killed by SIGKILL" in v.reason
    (dead,) = v.findings
    assert (dead.code, dead.severity) == ("DEAD", "critical")
    (internal,) = wd.guard.findings(b.now)
    assert (internal.key, internal.severity) == ("watchdog.state", "critical")


def test_a_frozen_param_group_at_lr_zero_is_no_mismatch_and_raises_nothing() -> None:
    s = SanityTracker()
    s.start_attempt(RequestedConfig(lr=1e-3), resumed=True, t=0.0)
    for i in range(30):
        s.observe_step(0, i, float(i), loss=2.0, lrs=[1e-3, 0.0])
    assert s.findings(31.0) == []
    assert s.guard.faults == {}


def test_every_group_at_lr_zero_is_a_mismatch_said_in_words() -> None:
    s = SanityTracker()
    s.start_attempt(RequestedConfig(lr=1e-3), resumed=True, t=0.0)
    for i in range(30):
        s.observe_step(0, i, float(i), loss=2.0, lrs=[0.0, 0.0])
    (f,) = s.findings(31.0)
    assert f.code == "LR_MISMATCH" and "zero in every group" in f.message
    assert s.guard.faults == {}


def test_a_raising_sanity_rule_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "sanity.lr")
    s = SanityTracker()
    s.start_attempt(RequestedConfig(lr=1e-3), resumed=True, t=0.0)
    for i in range(30):
        s.observe_step(0, i, float(i), loss=float("nan") if i > 25 else 2.0, lrs=[1e-5])
    codes = {f.code for f in s.findings(31.0)}
    assert "NONFINITE" in codes and "LR_MISMATCH" not in codes
    faults: dict[str, Fault] = s.guard.faults
    assert set(faults) == {"sanity.lr"} and "InjectedFault" in faults["sanity.lr"].error


def test_a_star_failpoint_spares_the_state_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "*")
    with pytest.raises(failpoints.InjectedFault):
        failpoints.check("watchdog.locks")
    failpoints.check("watchdog.state")
    monkeypatch.setenv(failpoints.ENV, "watchdog.state")
    with pytest.raises(failpoints.InjectedFault):
        failpoints.check("watchdog.state")


def test_a_raising_probe_is_a_fault_in_the_sample_and_the_others_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(failpoints.ENV, "probe.gpu")
    sample = ProbeSweep().sample(ProbeTargets())
    assert set(sample.faults) == {"probe.gpu"}
    assert sample.faults["probe.gpu"].startswith("InjectedFault: failpoint probe.gpu")
    assert sample.gpu is not None and not sample.gpu.available
    assert sample.host is not None and sample.host.available
