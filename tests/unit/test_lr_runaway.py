"""LR_RUNAWAY: an LR that starts in band and climbs past lr_runaway_ratio x the requested one is
a finding, with where it began, where it is now and its peak; it closes when the LR comes back;
an LR far off from the first step is LR_MISMATCH's, not this one's."""

from __future__ import annotations

from trainroom.core.configuration.config import Thresholds
from trainroom.core.health.lr_runaway import RunawayCheck
from trainroom.core.health.sanity import SanityTracker
from trainroom.core.wire.protocol import RequestedConfig

TH = Thresholds()


def ramp(check: RunawayCheck, lrs: list[float], requested: float = 3e-3) -> None:
    for step, lr in enumerate(lrs, start=1):
        check.observe(TH, requested, step, 1000.0 + step, lr)


def test_the_demo_s_diverge_ramp_opens_it_where_it_passes_ten_times_the_request() -> None:
    # The demo's diverge fault: x1.05 a step from 3e-3 at step 30, up to 300x.
    lrs = [3e-3] * 30 + [min(3e-3 * 1.05 ** (i + 1), 0.9) for i in range(150)]
    check = RunawayCheck()
    ramp(check, lrs)
    f = check.finding(TH)
    assert f is not None and f.code == "LR_RUNAWAY" and f.severity == "critical"
    first = next(i for i, lr in enumerate(lrs, start=1) if lr / 3e-3 > TH.lr_runaway_ratio)
    assert f.evidence["step"] == first and f.evidence["base_step"] == first - 1
    assert f.evidence["last"] == 0.9 and f.evidence["last_step"] == len(lrs)
    assert f.message.startswith(f"effective LR {lrs[first - 1]:.4g} at step {first} is 10.")
    assert "(bound 10x)" in f.message and "now 0.9 at step 180 (300x)" in f.message
    # It comes back within the bound: closed.
    check.observe(TH, 3e-3, 181, 2000.0, 3e-3)
    assert check.finding(TH) is None


def test_an_lr_far_off_from_the_first_step_is_left_to_lr_mismatch() -> None:
    check = RunawayCheck()
    ramp(check, [0.9] * 20)
    assert check.finding(TH) is None


def test_a_schedule_within_the_bound_raises_nothing() -> None:
    # A warm-up to the requested LR, then cosine decay; a peak at 9x (a one-cycle max) too.
    check = RunawayCheck()
    ramp(check, [3e-3 * min(1.0, i / 100) + 1e-6 for i in range(200)] + [2.7e-2] * 10)
    assert check.finding(TH) is None


def test_the_tracker_raises_it_through_its_rule_from_the_primary_rank_s_reported_lr() -> None:
    tr = SanityTracker()
    tr.start_attempt(RequestedConfig(lr=1e-3), resumed=False, t=0.0)
    for step in range(1, 40):
        tr.observe_step(0, step, float(step), loss=2.0, grad_norm=1.0, lrs=[1e-3 if step < 20 else 2e-2])
        tr.observe_step(1, step, float(step), loss=2.0, grad_norm=1.0, lrs=[1.0])  # not the primary
    (f,) = [x for x in tr.findings(40.0) if x.code == "LR_RUNAWAY"]
    assert f.evidence["step"] == 20 and f.evidence["ratio"] == 20.0 and f.evidence["base_step"] == 19
