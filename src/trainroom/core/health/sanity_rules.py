"""The sanity rules as pure functions: the events the tracker holds (an LR mismatch, the first
loss, a white-model streak, a spike or a grad explosion, a divergence, a non-finite step, a
loss-scale halving), how one observation advances them, and the finding each one gives.
Thresholds come from `config.Thresholds`; nothing here holds state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.robust import finite
from trainroom.core.run.figures import ln_v

REIMPOSE_HINT = "call trainroom.reimpose_lr(optimizer, scheduler, lr) after loading the checkpoint"
DEFAULT_THRESHOLDS = Thresholds()


def lr_out_of_band(
    requested: float,
    effective: Sequence[float],
    th: Thresholds = DEFAULT_THRESHOLDS,
    expected: Sequence[float] = (),
) -> list[tuple[int, float, float]]:
    """(group, effective, ratio) for each param group whose effective LR lies outside
    [reference / lr_too_low_ratio, reference x lr_too_high_ratio]. The reference is `requested`,
    or per group `expected` when given: what the session's schedule gives at this position, as
    reimpose_lr set it (a StepLR resumed past two milestones is legitimately 100x below its base)."""
    out: list[tuple[int, float, float]] = []
    # A group at exactly 0 beside groups that train is frozen on purpose (a backbone kept
    # fixed), not a mismatch; every group at 0 is one.
    frozen_ok = any(finite(e) and e != 0 for e in effective)
    for i, eff in enumerate(effective):
        if not finite(eff) or (eff == 0 and frozen_ok):
            continue
        ratio = eff / (expected[min(i, len(expected) - 1)] if expected else requested)
        if ratio < 1 / th.lr_too_low_ratio or ratio > th.lr_too_high_ratio:
            out.append((i, eff, ratio))
    return out


def fmt_value(x: float | None) -> str:
    """A loss, LR, ratio or grad norm to four significant figures (three at the extremes); `?`
    when unknown."""
    if x is None:
        return "?"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 1e5 or ax < 1e-3:
        return f"{x:.3g}"
    return f"{x:.4g}"


# ============================================================== the events the tracker holds


class LrMismatch(msgspec.Struct, kw_only=True):
    step: int
    t: float
    requested: float
    groups: list[tuple[int, float, float]]  # (group, effective, ratio)
    resumed: bool
    fresh: bool  # the attempt began from scratch (step index small, not a resume)
    last_step: int
    last_t: float
    # What reimpose_lr set per group (the session's schedule at the restored position), when the
    # check was against it rather than the requested base LR.
    expected: list[float] = []


class FirstLoss(msgspec.Struct, kw_only=True):
    step: int
    t: float
    loss: float


class WhiteStreak(msgspec.Struct, kw_only=True):
    start_step: int
    start_t: float
    last_step: int
    last_t: float
    n: int = 0
    total: float = 0.0


class Excursion(msgspec.Struct, kw_only=True):
    """A loss spike or a grad-norm explosion: start, peak, and when it came back in."""

    start_step: int
    start_t: float
    baseline: float
    threshold: float  # absolute excess over the baseline that makes it an excursion
    cap: float = math.inf  # and a value above this is one whatever the baseline
    peak: float
    peak_step: int
    last: float
    last_step: int
    recovered_step: int | None = None
    recovered_t: float | None = None
    count: int = 1  # excursions seen in this attempt, this one included
    run: int = 1  # observations in a row past the band (what confirms a candidate)


class Divergence(msgspec.Struct, kw_only=True):
    since_step: int
    since_t: float
    best: float
    best_step: int
    band: float
    medians: list[float]
    last_step: int
    noise: float = 0.0  # the standard error of one window's median, from the loss's own noise


class NonFinite(msgspec.Struct, kw_only=True):
    first_step: int
    first_t: float
    first_rank: int
    first_field: str
    first_value: float
    last_step: int
    last_t: float
    count: int = 1
    bad_ranks: list[int] = []  # ranks whose latest observation is still non-finite

    @property
    def open(self) -> bool:
        return bool(self.bad_ranks)


class ScaleHalving(msgspec.Struct, kw_only=True):
    step: int
    t: float
    old: float
    new: float


class TracerReport(msgspec.Struct, kw_only=True):
    rank: int
    step: int | None
    t: float
    module: str


# ============================================================== how an observation advances them


def exploded(first_loss: float, lnv: float, th: Thresholds = DEFAULT_THRESHOLDS) -> bool:
    return first_loss > th.exploded_start_factor * lnv


def white_model_open(w: WhiteStreak, th: Thresholds = DEFAULT_THRESHOLDS) -> bool:
    return w.last_step - w.start_step + 1 >= th.white_steps and w.n >= th.white_min_observations


def advance_excursion(
    ev: Excursion | None,
    cand: Excursion | None,
    step: int,
    t: float,
    value: float,
    baseline: float,
    threshold: float,
    cap: float = math.inf,
    immediate: float = 0.0,
    confirm: int = 1,
) -> tuple[Excursion | None, Excursion | None]:
    """One observation against (baseline, threshold, absolute cap): starts, grows or ends an
    excursion; returns (excursion, candidate). A value past the threshold starts a candidate that
    becomes the excursion after `confirm` observations in a row past it; one past `immediate` or
    the cap is an excursion at once. A recovered excursion is kept until a new one replaces it."""
    excess = value - baseline
    above = excess > threshold or value > cap
    if ev is not None and ev.recovered_step is None:
        ev.last, ev.last_step = value, step
        if value > ev.peak:
            ev.peak, ev.peak_step = value, step
        # Back in means back under the threshold measured from the baseline the excursion left.
        if value - ev.baseline <= ev.threshold and value <= ev.cap:
            ev.recovered_step, ev.recovered_t = step, t
        return ev, None
    if not above:
        return ev, None
    if cand is None:
        cand = Excursion(
            start_step=step,
            start_t=t,
            baseline=baseline,
            threshold=threshold,
            cap=cap,
            peak=value,
            peak_step=step,
            last=value,
            last_step=step,
        )
    else:
        cand.run += 1
        cand.last, cand.last_step = value, step
        if value > cand.peak:
            cand.peak, cand.peak_step = value, step
    if value > cap or (immediate > 0 and excess > max(immediate, threshold)) or cand.run >= confirm:
        cand.count = 1 if ev is None else ev.count + 1
        return cand, None
    return ev, cand


def excursion_open(ev: Excursion, now: float, th: Thresholds = DEFAULT_THRESHOLDS) -> bool:
    return ev.recovered_t is None or now - ev.recovered_t < th.hold_s


def divergence_state(
    medians: list[tuple[float, int, float]],
    best: tuple[float, int],
    last_step: int,
    th: Thresholds = DEFAULT_THRESHOLDS,
    noise: float = 0.0,
) -> Divergence | None:
    """Divergence when the last `divergence_chunks` chunk medians all sit above the best chunk
    median of the attempt by more than the band: the trajectory stopped coming back. `noise` is
    the standard error of one chunk's median: the band is at least `divergence_noise_se` of them,
    so a best set low by the noise alone (a noisy loss, or one read at sampled steps) is no rise."""
    if len(medians) < th.divergence_chunks:
        return None
    b, b_step = best
    band = max(th.divergence_rel * abs(b), th.divergence_min_nats, th.divergence_noise_se * noise)
    if not all(m > b + band for m, _, _ in medians):
        return None
    return Divergence(
        since_step=medians[0][1],
        since_t=medians[0][2],
        best=b,
        best_step=b_step,
        band=band,
        medians=[m for m, _, _ in medians],
        last_step=last_step,
        noise=noise,
    )


# ============================================================== the findings


def lr_mismatch_finding(m: LrMismatch, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    worst = max(m.groups, key=lambda g: abs(math.log(g[2])) if g[2] > 0 else math.inf)
    group, eff, ratio = worst
    low = ratio < 1
    factor = (1 / ratio) if low and ratio > 0 else ratio
    how = (
        "the LR is zero in every group"
        if ratio == 0
        else f"{factor:.3g}x {'below' if low else 'above'} (ratio {fmt_value(ratio)})"
    )
    where = "the first step after the resume" if m.resumed else "the first step of this attempt"
    ref = m.expected[min(group, len(m.expected) - 1)] if m.expected else m.requested
    if m.expected:
        where = "the first step after reimpose_lr"
        cause = (
            "the LR changed after reimpose_lr set it: call it after the last load_state_dict of the "
            "optimizer and the scheduler, and do not rebuild either after it"
        )
    elif m.fresh:
        cause = (
            "the optimizer was built with another lr than requested, or a scheduler scales it "
            "(an undeclared warmup? declare warmup_steps in reporter.connect)"
        )
    else:
        cause = (
            "state restored from a checkpoint overrides the session: scheduler.load_state_dict brings "
            "back base_lrs, optimizer.load_state_dict brings back lr and initial_lr, from the run "
            f"that saved it; {REIMPOSE_HINT}"
        )
    groups = ", ".join(f"group {g} {fmt_value(e)} (x{fmt_value(r)})" for g, e, r in m.groups)
    against = (
        f"{fmt_value(ref)}, what the session's schedule gives here (requested base {fmt_value(m.requested)})"
        if m.expected
        else f"requested {fmt_value(m.requested)}"
    )
    msg = (
        f"effective LR {fmt_value(eff)} vs {against}: {how} on {where} (step {m.step}); likely cause: {cause}"
    )
    if len(m.groups) > 1:
        msg += f" [{groups}]"
    return Finding(
        code="LR_MISMATCH",
        severity="warning",
        message=msg,
        evidence={
            "requested": m.requested,
            "expected": ref if m.expected else None,
            "effective": eff,
            "ratio": ratio,
            "group": group,
            "groups": [{"group": g, "effective": e, "ratio": r} for g, e, r in m.groups],
            "step": m.step,
            "last_step": m.last_step,
            "resumed": m.resumed,
            "band": [1 / th.lr_too_low_ratio, th.lr_too_high_ratio],
        },
    )


def exploded_start_finding(first: FirstLoss, vocab_size: int, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    lnv = ln_v(vocab_size)
    assert lnv is not None  # the tracker asks only once V is known
    return Finding(
        code="EXPLODED_START",
        severity="warning",
        action="verify",
        message=(
            f"first loss {fmt_value(first.loss)} at step {first.step} vs ln V = {lnv:.3f} (V = {vocab_size}): "
            f"{first.loss / lnv:.1f}x the uniform-guess baseline (limit {th.exploded_start_factor:g}x); "
            "the starting weights look exploded (an output head with a huge std?): verify the starting "
            "checkpoint before spending steps normalising it"
        ),
        evidence={
            "first_loss": first.loss,
            "step": first.step,
            "ln_v": lnv,
            "vocab_size": vocab_size,
            "ratio": first.loss / lnv,
            "factor": th.exploded_start_factor,
        },
    )


def white_model_finding(w: WhiteStreak, vocab_size: int, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    lnv = ln_v(vocab_size)
    assert lnv is not None  # the tracker asks only once V is known
    mean = w.total / w.n if w.n else lnv
    steps = w.last_step - w.start_step + 1
    return Finding(
        code="WHITE_MODEL",
        severity="warning",
        message=(
            f"loss {mean:.4f} has stayed within {th.white_band:.0%} of ln V = {lnv:.3f} (V = {vocab_size}) "
            f"for {steps} steps (since step {w.start_step}): e^-L = {math.exp(-mean):.3g}, the "
            f"geometric-mean probability of the right token, is what uniform guessing gives (1/V = "
            f"{1 / vocab_size:.3g}): the model has learned nothing"
        ),
        evidence={
            "loss": mean,
            "ln_v": lnv,
            "vocab_size": vocab_size,
            "steps": steps,
            "since_step": w.start_step,
            "last_step": w.last_step,
            "geo_mean_p": math.exp(-mean),
            "uniform_p": 1 / vocab_size,
            "band": th.white_band,
        },
    )


def loss_spike_finding(s: Excursion, latest: float | None, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    size = s.peak - s.baseline
    if s.recovered_step is not None:
        n = s.recovered_step - s.start_step
        state = f"recovered after {n} step{'s' if n != 1 else ''} (step {s.recovered_step})"
    else:
        state = (
            f"not recovered: {fmt_value(latest)} at step {s.last_step}, {s.last_step - s.start_step} steps on"
        )
    more = f"; {s.count} spikes this attempt" if s.count > 1 else ""
    return Finding(
        code="LOSS_SPIKE",
        severity="info" if s.recovered_step is not None else "warning",
        message=(
            f"loss spike at step {s.start_step}: {fmt_value(s.baseline)} -> {fmt_value(s.peak)} (+{size:.3g} nats over "
            f"the median of the latest {th.spike_baseline_window} steps; band +{s.threshold:.3g}), {state}{more}"
        ),
        evidence={
            "step": s.start_step,
            "baseline": s.baseline,
            "peak": s.peak,
            "peak_step": s.peak_step,
            "size_nats": size,
            "threshold": s.threshold,
            "recovered": s.recovered_step is not None,
            "recovered_step": s.recovered_step,
            "last": latest,
            "count": s.count,
        },
    )


def divergence_finding(d: Divergence, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    cur = d.medians[-1]
    trend = "rising" if cur > d.medians[0] else "holding"
    return Finding(
        code="DIVERGENCE",
        severity="warning",
        message=(
            f"rolling median loss {fmt_value(cur)} has stayed above the attempt's best {fmt_value(d.best)} (step "
            f"{d.best_step}) + band {d.band:.3g} for {len(d.medians)} windows of {th.divergence_chunk} "
            f"records ({d.last_step - d.since_step + 1} steps) since step {d.since_step}, {trend} ({fmt_value(d.medians[0])} -> {fmt_value(cur)}): the trajectory "
            "is not coming back; look at LR, warmup and the data before it turns NaN"
        ),
        evidence={
            "median": cur,
            "best": d.best,
            "best_step": d.best_step,
            "band": d.band,
            "since_step": d.since_step,
            "medians": d.medians,
            "last_step": d.last_step,
            "noise_se": d.noise,
        },
    )


def grad_explosion_finding(g: Excursion, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    ratio = g.peak / g.baseline if g.baseline > 0 else math.inf
    if g.recovered_step is not None:
        state = f"back in range at step {g.recovered_step}"
    else:
        state = f"still {fmt_value(g.last)} at step {g.last_step}"
    ref = (
        f"{ratio:.3g}x its median {fmt_value(g.baseline)} over the last {th.grad_window} steps"
        if g.baseline > 0
        else f"above the absolute cap {fmt_value(th.grad_abs_max)} before any history"
    )
    return Finding(
        code="GRAD_EXPLOSION",
        severity="info" if g.recovered_step is not None else "warning",
        message=(
            f"grad norm {fmt_value(g.peak)} at step {g.peak_step} (10^{math.log10(g.peak):.0f}), {ref}; {state}"
        ),
        evidence={
            "step": g.start_step,
            "peak": g.peak,
            "peak_step": g.peak_step,
            "median": g.baseline,
            "ratio": ratio if math.isfinite(ratio) else None,
            "recovered": g.recovered_step is not None,
            "last": g.last,
            "count": g.count,
        },
    )


def nonfinite_finding(nf: NonFinite, tracer: TracerReport | None) -> Finding:
    msg = (
        f"{nf.first_field} is {nf.first_value} at step {nf.first_step} on rank {nf.first_rank} "
        f"({nf.count} non-finite step{'s' if nf.count != 1 else ''}, last at step {nf.last_step}"
        f"{'' if nf.open else '; finite again since'})"
    )
    evidence: dict[str, Any] = {
        "step": nf.first_step,
        "rank": nf.first_rank,
        "field": nf.first_field,
        "value": str(nf.first_value),
        "count": nf.count,
        "last_step": nf.last_step,
        "open": nf.open,
    }
    if tracer is not None:
        at = f" (step {tracer.step})" if tracer.step is not None else ""
        msg += f"; first non-finite module: {tracer.module}{at}, from the tracer"
        evidence["module"] = tracer.module
        evidence["module_step"] = tracer.step
    else:
        msg += "; turn on trainroom.NonFiniteTracer(model) to name the first non-finite module"
    return Finding(code="NONFINITE", severity="critical", message=msg, evidence=evidence)


def loss_scale_finding(
    halvings: list[ScaleHalving], scale: float | None, now: float, th: Thresholds = DEFAULT_THRESHOLDS
) -> Finding | None:
    """Info while a halving is recent: the scaler skipped an overflowing step, as designed. A
    warning only when the scale fell below the floor: every scale overflows, the numerics broke."""
    collapsed = scale is not None and scale < th.loss_scale_floor
    recent = [h for h in halvings if now - h.t < th.hold_s]
    if not recent and not collapsed:
        return None
    last = halvings[-1] if halvings else None
    if collapsed:
        msg = (
            f"loss scale collapsed to {fmt_value(scale)} (floor {fmt_value(th.loss_scale_floor)}): the scaler "
            "halves at every step, so gradients overflow at any scale; expect NONFINITE"
        )
    else:
        assert last is not None
        msg = (
            f"fp16 loss scale halved {last.old:g} -> {last.new:g} at step {last.step}: the "
            f"overflowing step was skipped, the scaler's controlled response, not an incident "
            f"({len(recent)} halving{'s' if len(recent) != 1 else ''} in the last {th.hold_s:g} s)"
        )
    return Finding(
        code="LOSS_SCALE",
        severity="warning" if collapsed else "info",
        message=msg,
        evidence={
            "scale": scale,
            "halvings_recent": len(recent),
            "last": None if last is None else {"step": last.step, "old": last.old, "new": last.new},
            "collapsed": collapsed,
        },
    )
