"""The keeper's own stall (its monotonic clock jumped between two evaluations) is not its
trainer's: the watchdog catches up before it judges, and measures SLOW again only once the
intervals around the stall have rolled out. RunStates from protocol records, a fake clock."""

from __future__ import annotations

from tests.support.run_builder import RunBuilder
from trainroom.core.health.watchdog import PAUSE_S, SETTLE_S, Verdict, WatchContext, Watchdog
from trainroom.core.run.handlers.ranks import INTERVALS


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _codes(v: Verdict) -> set[str]:
    return {f.code for f in v.findings}


def _tick(wd: Watchdog, b: RunBuilder, clock: Clock, dt: float = 0.1, probe_lag: float = 0.0) -> Verdict:
    clock.t += dt
    b.now += dt
    return wd.evaluate(b.run, WatchContext(alive=True, probe_t=b.now - probe_lag), b.now)


def test_the_keepers_own_gap_is_no_hang_and_a_real_one_after_it_is() -> None:
    clock, b = Clock(), RunBuilder()
    wd = Watchdog(clock=clock)
    b.start()
    b.steps(50)
    assert _tick(wd, b, clock).state == "running"
    # The keeper stopped for 30 s: its clocks jump, nothing it missed is read yet, the probe is old.
    v = _tick(wd, b, clock, dt=30.0, probe_lag=30.0)
    assert v.state == "running" and not _codes(v) & {"HUNG", "STALLED"}, v
    assert "did not run for 30 s" in v.reason and [round(p.gap_s) for p in wd.pauses] == [30]
    # Still catching up (no fresh probe, within SETTLE_S): still not judged on the gap.
    assert _tick(wd, b, clock, dt=SETTLE_S / 2, probe_lag=SETTLE_S + 30).state == "running"
    # The frames it missed are read: the trainer was stepping all along.
    b.steps(20, interval=0.001)
    for _ in range(int(SETTLE_S / 0.1) + 2):
        assert _tick(wd, b, clock).state == "running"
    # A trainer that really goes silent after that is judged as ever.
    states = [_tick(wd, b, clock).state for _ in range(120)]
    assert states[-1] == "hung" and "running" in states


def test_a_gap_within_pause_s_is_not_a_stall_of_the_keeper() -> None:
    clock, b = Clock(), RunBuilder()
    wd = Watchdog(clock=clock)
    b.start()
    b.steps(50)
    _tick(wd, b, clock)
    _tick(wd, b, clock, dt=PAUSE_S * 0.9)
    assert wd.pauses == []


def test_slow_waits_until_the_intervals_around_the_stall_rolled_out() -> None:
    clock, b = Clock(), RunBuilder()
    wd = Watchdog(clock=clock)
    b.start()
    b.steps(40, interval=0.1)
    _tick(wd, b, clock, dt=0.0)
    # The keeper stopped 5 s; what the trainer sent meanwhile is read in one burst.
    _tick(wd, b, clock, dt=5.0, probe_lag=5.0)
    b.steps(1, interval=0.001)
    b.steps(30, interval=0.001)
    for _ in range(int(SETTLE_S / 0.1) + 2):
        _tick(wd, b, clock)
    # Normal steps after a burst of near-zero intervals look slow against them: not said.
    seen = set()
    for _ in range(INTERVALS - 10):
        b.steps(1, interval=0.1)
        v = _tick(wd, b, clock, dt=0.0)
        seen.add(v.state)
        assert "SLOW" not in _codes(v)
    assert seen == {"running"}
    # Once the window holds only intervals measured after the stall, SLOW judges again.
    b.steps(INTERVALS, interval=0.1)
    b.steps(5, interval=0.5)
    v = _tick(wd, b, clock, dt=0.0)
    assert v.state == "slow" and "SLOW" in _codes(v)
