"""LR_RUNAWAY: the effective LR climbing far above the one requested during an attempt.

LR_MISMATCH judges an attempt's first step (a restored scheduler, a wrong optimizer lr); a
schedule that runs away later (a warm-up without an end, a multiplier stepped every step, a
scheduler restored twice) starts in band and climbs past it while the loss still looks fine. The
loss spike, the divergence, the gradient explosion and the rejected checkpoints that follow are
its consequences (`vocab.FOLLOWS`), so it is the root the control room names when it came first.

The figure comes from the trainer's own report of its optimizer's param-group LRs (`Step.lr`,
group 0 on the primary rank), against the session's requested LR (`RequestedConfig.lr`); the
bound is `Thresholds.lr_runaway_ratio`.
"""

from __future__ import annotations

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.robust import finite
from trainroom.core.health.sanity_rules import fmt_value


class Runaway(msgspec.Struct, kw_only=True):
    step: int  # the first step past the bound
    t: float
    requested: float
    effective: float  # at `step`
    base_step: int  # the last step the LR was within the bound
    base: float
    peak: float
    peak_step: int
    last: float
    last_step: int


class RunawayCheck:
    """The primary rank's group-0 LR, step by step: open once it passes the bound after a step
    within it, closed when it comes back within the bound."""

    def __init__(self) -> None:
        self.within: tuple[int, float] | None = None  # the last step within the bound, its LR
        self.runaway: Runaway | None = None

    def observe(self, th: Thresholds, requested: float | None, step: int, t: float, lr: float) -> None:
        if not requested or not finite(lr) or lr <= 0:
            return
        ratio = lr / requested
        r = self.runaway
        if ratio <= th.lr_runaway_ratio:
            self.within, self.runaway = (step, lr), None
            return
        if r is not None:
            r.last, r.last_step = lr, step
            if lr > r.peak:
                r.peak, r.peak_step = lr, step
            return
        if self.within is None:
            return  # far above from the first step on: LR_MISMATCH says that one
        base_step, base = self.within
        self.runaway = Runaway(
            step=step,
            t=t,
            requested=requested,
            effective=lr,
            base_step=base_step,
            base=base,
            peak=lr,
            peak_step=step,
            last=lr,
            last_step=step,
        )

    def finding(self, th: Thresholds) -> Finding | None:
        return lr_runaway_finding(self.runaway, th) if self.runaway is not None else None


def lr_runaway_finding(r: Runaway, th: Thresholds) -> Finding:
    now = f"now {fmt_value(r.last)} at step {r.last_step} ({fmt_value(r.last / r.requested)}x)"
    peak = "" if r.peak == r.last else f", peak {fmt_value(r.peak)} at step {r.peak_step}"
    return Finding(
        code="LR_RUNAWAY",
        severity="critical",
        message=(
            f"effective LR {fmt_value(r.effective)} at step {r.step} is {fmt_value(r.effective / r.requested)}x the "
            f"requested {fmt_value(r.requested)} (bound {th.lr_runaway_ratio:g}x), up from "
            f"{fmt_value(r.base)} at step {r.base_step}; {now}{peak}: a schedule or multiplier runs away "
            "(the optimizer's param groups, as the trainer reports them); the loss will follow it"
        ),
        evidence={
            "step": r.step,
            "requested": r.requested,
            "effective": r.effective,
            "ratio": r.effective / r.requested,
            "base_step": r.base_step,
            "base": r.base,
            "peak": r.peak,
            "peak_step": r.peak_step,
            "last": r.last,
            "last_step": r.last_step,
            "bound": th.lr_runaway_ratio,
            "source": "the trainer's reported param-group 0 LR on the primary rank",
        },
    )
