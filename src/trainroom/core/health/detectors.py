"""The sanity detectors: one small object per finding, each with only the state it needs.

A detector is fed observations (`observe`) and asked for its finding (`finding`), which is a pure
function of what it holds, the attempt's `Facts` and `now`. The facts every detector reads (what
the trainer asked for, whether this attempt resumed, the primary rank, each rank's latest
figures) belong to the attempt and are written by one feeder (`sanity.SanityTracker`); no
detector writes another's state. A new attempt starts a fresh `Detectors`.

A new detector: its class here, its place in `Detectors` (its state, and the line of
`Detectors.observe_step` that feeds it), its rule in `rules.SANITY`, its code in the vocabulary.

Robust statistics throughout (median and MAD, never mean and std): one absurd batch must not move
the baseline it is measured against.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.guard import Guard
from trainroom.core.health.lr_runaway import RunawayCheck
from trainroom.core.health.ranks import RankObservations
from trainroom.core.health.robust import Rolling, finite
from trainroom.core.health.sanity_rules import (
    Divergence,
    Excursion,
    FirstLoss,
    LrMismatch,
    NonFinite,
    ScaleHalving,
    TracerReport,
    WhiteStreak,
    advance_excursion,
    divergence_finding,
    divergence_state,
    excursion_open,
    exploded,
    exploded_start_finding,
    grad_explosion_finding,
    loss_scale_finding,
    loss_spike_finding,
    lr_mismatch_finding,
    lr_out_of_band,
    nonfinite_finding,
    white_model_finding,
    white_model_open,
)
from trainroom.core.run.figures import ln_v
from trainroom.core.wire.protocol import RequestedConfig

LrPhase = Literal["pending", "open", "done"]


@dataclass
class Facts:
    """What every detector of one attempt may read; only the feeder writes it."""

    th: Thresholds
    requested: RequestedConfig = field(default_factory=RequestedConfig)
    resumed: bool = False
    primary: int | None = None  # the lowest rank seen: the loss detectors read it
    first_step: int | None = None  # the primary's first step this attempt
    prev_lr: float | None = None  # the primary's group-0 LR on its previous step
    ranks: dict[int, RankObservations] = field(default_factory=dict)

    def in_warmup(self, step: int, rising_lr: bool) -> bool:
        """A declared warmup decides; without one, an LR still rising step over step is one."""
        if self.requested.warmup_steps is not None:
            return step < self.requested.warmup_steps
        return rising_lr

    def in_declared_warmup(self, step: int) -> bool:
        w = self.requested.warmup_steps
        return w is not None and step < w

    def primary_scale(self) -> float | None:
        rs = self.ranks.get(self.primary) if self.primary is not None else None
        return rs.scale if rs is not None else None


class LrCheck:
    """LR_MISMATCH: the effective LR of the first step checked against what was asked for (or,
    after the SDK's reimpose_lr, against what it set)."""

    def __init__(self) -> None:
        self.phase: LrPhase = "pending"  # pending -> done, or pending -> open -> done
        self.expected: list[float] = []  # what reimpose_lr set per group (its note)
        self.mismatch: LrMismatch | None = None
        self.rose = False  # the LR rose since the attempt's first step: a warm-up under way

    def reimposed(self, expected: list[float]) -> None:
        """The trainer fixed its LR: check the next step afresh, against what it set."""
        self.phase, self.expected = "pending", expected

    def observe(self, f: Facts, step: int, t: float, lrs: Sequence[float], rising: bool) -> None:
        req = f.requested.lr
        if not req or self.phase == "done":
            return
        expected = self.expected
        if self.phase == "pending" and not expected and f.in_declared_warmup(step):
            return
        bad = lr_out_of_band(req, lrs, f.th, expected)
        if not bad:
            self.mismatch, self.phase = None, "done"
            return
        if self.phase == "open" and self.mismatch is not None:
            self.mismatch.groups, self.mismatch.last_step, self.mismatch.last_t = bad, step, t
            return
        fresh = not expected and not f.resumed and (f.first_step or 0) <= f.th.fresh_start_max_step
        all_low = all(ratio < 1 for _, _, ratio in bad)
        if fresh and all_low and self._warming(f, step, lrs[0], rising):
            return
        self.mismatch = LrMismatch(
            step=step,
            t=t,
            requested=req,
            groups=bad,
            resumed=f.resumed,
            fresh=fresh,
            last_step=step,
            last_t=t,
            expected=list(expected),
        )
        self.phase = "open"

    def _warming(self, f: Facts, step: int, lr0: float, rising: bool) -> bool:
        """Maybe an undeclared warm-up on a start from scratch: the LR low and still rising. A
        scheduler stepped less often than the steps are seen (per epoch, Lightning's default
        interval) raises it in stairs: once it has risen, flat stretches are the stairs' treads,
        and only a fall while it is still low ends the warm-up."""
        self.rose = self.rose or rising
        fell = f.prev_lr is not None and lr0 < f.prev_lr * (1 - 1e-6)
        return f.prev_lr is None or rising or (self.rose and not fell)

    def finding(self, f: Facts, now: float) -> Finding | None:
        return lr_mismatch_finding(self.mismatch, f.th) if self.mismatch is not None else None


class FirstLossCheck:
    """EXPLODED_START: the attempt's first loss far above ln(vocab)."""

    def __init__(self) -> None:
        self.first: FirstLoss | None = None

    def observe(self, f: Facts, step: int, t: float, loss: float, rising: bool) -> None:
        if self.first is None:
            self.first = FirstLoss(step=step, t=t, loss=loss)

    def finding(self, f: Facts, now: float) -> Finding | None:
        lnv = ln_v(f.requested.vocab_size)
        if lnv is None or self.first is None or not exploded(self.first.loss, lnv, f.th):
            return None
        return exploded_start_finding(self.first, f.requested.vocab_size or 0, f.th)


class WhiteCheck:
    """WHITE_MODEL: the loss sitting at ln(vocab) past warmup (the model predicts uniformly)."""

    def __init__(self) -> None:
        self.streak: WhiteStreak | None = None

    def observe(self, f: Facts, step: int, t: float, loss: float, rising: bool) -> None:
        lnv = ln_v(f.requested.vocab_size)
        if lnv is None:
            return
        if abs(loss - lnv) > f.th.white_band * lnv:
            self.streak = None
        elif not f.in_warmup(step, rising):
            w = self.streak
            if w is None:
                w = self.streak = WhiteStreak(start_step=step, start_t=t, last_step=step, last_t=t)
            w.last_step, w.last_t = step, t
            w.n += 1
            w.total += loss

    def finding(self, f: Facts, now: float) -> Finding | None:
        lnv = ln_v(f.requested.vocab_size)
        if lnv is None or self.streak is None or not white_model_open(self.streak, f.th):
            return None
        return white_model_finding(self.streak, f.requested.vocab_size or 0, f.th)


class SpikeCheck:
    """LOSS_SPIKE: a loss far above the level of the window before it."""

    def __init__(self, th: Thresholds) -> None:
        self.level = Rolling(th.loss_window, th.refresh_every, th.min_window, recent=th.spike_baseline_window)
        self.spike: Excursion | None = None
        self._cand: Excursion | None = None

    def observe(self, f: Facts, step: int, t: float, loss: float, rising: bool) -> None:
        th = f.th
        level = self.level.level  # the level of the window *before* this value
        if level is not None:
            med, sigma = level
            thr = max(th.spike_sigmas * sigma, th.spike_min_rel * abs(med), th.spike_min_nats)
            self.spike, self._cand = advance_excursion(
                self.spike,
                self._cand,
                step,
                t,
                loss,
                med,
                thr,
                immediate=th.spike_immediate * thr,
                confirm=th.confirm_steps,
            )
        self.level.append(loss)

    def finding(self, f: Facts, now: float) -> Finding | None:
        if self.spike is None or not excursion_open(self.spike, now, f.th):
            return None
        return loss_spike_finding(self.spike, self.level.values[-1] if self.level.values else None, f.th)


class DivergenceCheck:
    """DIVERGENCE: medians of consecutive chunks of losses rising above the attempt's best."""

    def __init__(self, th: Thresholds) -> None:
        self.chunk: list[float] = []
        self.chunk_start: tuple[int, float] | None = None
        self.medians: deque[tuple[float, int, float]] = deque(maxlen=th.divergence_chunks)
        self.best: tuple[float, int] | None = None
        self.divergence: Divergence | None = None
        # Each chunk's noise: sigma from its successive differences (robust: their median absolute
        # value / (0.6745 x sqrt 2)); the band reads the median of the recent ones.
        self.noises: deque[float] = deque(maxlen=32)
        self.best_se = 0.0

    def observe(self, f: Facts, step: int, t: float, loss: float, rising: bool) -> None:
        if self.chunk_start is None:
            self.chunk_start = (step, t)
        self.chunk.append(loss)
        if len(self.chunk) < f.th.divergence_chunk:
            return
        m = statistics.median(self.chunk)
        diffs = [abs(b - a) for a, b in zip(self.chunk, self.chunk[1:], strict=False)]
        self.noises.append(statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0)
        n = len(self.chunk)
        start_step, start_t = self.chunk_start
        self.chunk.clear()
        self.chunk_start = None
        self.medians.append((m, start_step, start_t))
        if self.best is None or m < self.best[0]:
            self.best = (m, start_step)
            # The noise as it was up to the best (a rise's own steps are not the noise it is judged
            # against); a median of n values has a standard error of ~1.2533 sigma / sqrt(n).
            self.best_se = 1.2533 * statistics.median(self.noises) / math.sqrt(n)
        self.divergence = divergence_state(list(self.medians), self.best, step, f.th, noise=self.best_se)

    def finding(self, f: Facts, now: float) -> Finding | None:
        return divergence_finding(self.divergence, f.th) if self.divergence is not None else None


class GradCheck:
    """GRAD_EXPLOSION: a gradient norm far above its recent level, or above the absolute cap."""

    def __init__(self, th: Thresholds) -> None:
        self.level = Rolling(th.grad_window, th.refresh_every, th.min_window)
        self.grad: Excursion | None = None
        self._cand: Excursion | None = None

    def observe(self, f: Facts, step: int, t: float, g: float) -> None:
        th = f.th
        level = self.level.level
        if level is not None:
            med, sigma = level
            thr = max(med * (th.grad_ratio - 1), th.grad_sigmas * sigma)
            self.grad, self._cand = advance_excursion(
                self.grad,
                self._cand,
                step,
                t,
                g,
                med,
                thr,
                cap=th.grad_abs_max,
                immediate=th.grad_immediate * thr,
                confirm=th.confirm_steps,
            )
        elif g > th.grad_abs_max or self.grad is not None:
            # No history yet: only the absolute cap can tell (a norm of 1e18 on the first step).
            self.grad, self._cand = advance_excursion(
                self.grad, None, step, t, g, 0.0, math.inf, cap=th.grad_abs_max
            )
        self.level.append(g)

    def finding(self, f: Facts, now: float) -> Finding | None:
        if self.grad is None or not excursion_open(self.grad, now, f.th):
            return None
        return grad_explosion_finding(self.grad, f.th)


class ScaleCheck:
    """LOSS_SCALE: the primary rank's fp16 loss-scale halvings (info until the scale collapses)."""

    def __init__(self) -> None:
        self.halvings: deque[ScaleHalving] = deque(maxlen=256)

    def observe(self, rs: RankObservations, step: int, t: float, scale: float | None, primary: bool) -> bool:
        """Whether this step halved the rank's scale (the non-finite check reads it)."""
        if scale is None or not math.isfinite(scale):
            return False
        halved = rs.scale is not None and scale < rs.scale
        if halved and primary and rs.scale is not None:
            self.halvings.append(ScaleHalving(step=step, t=t, old=rs.scale, new=scale))
        rs.scale = scale
        return halved

    def finding(self, f: Facts, now: float) -> Finding | None:
        return loss_scale_finding(list(self.halvings), f.primary_scale(), now, f.th)


class NonFiniteCheck:
    """NONFINITE: a NaN/inf loss or gradient norm on any rank (an overflow the loss scaler
    skipped, a halving, is not one), with the module the tracer named first."""

    def __init__(self) -> None:
        self.nonfinite: NonFinite | None = None
        self.tracer: TracerReport | None = None

    def traced(self, report: TracerReport) -> None:
        self.tracer = report

    def observe(
        self,
        f: Facts,
        rs: RankObservations,
        step: int,
        t: float,
        loss: float | None,
        grad_norm: float | None,
        scale: float | None,
        halved: bool,
    ) -> None:
        pend = rs.pending_grad
        if pend is not None:
            rs.pending_grad = None
            if not halved:  # no halving followed the inf grad norm: not an overflow skip
                self._seen(f, rs.rank, pend[0], pend[1], "grad_norm", pend[2])
        bad_loss = loss is not None and not math.isfinite(loss)
        bad_grad = grad_norm is not None and not math.isfinite(grad_norm)
        if bad_loss and loss is not None:
            self._seen(f, rs.rank, step, t, "loss", loss)
        elif bad_grad and grad_norm is not None:
            if scale is None:
                self._seen(f, rs.rank, step, t, "grad_norm", grad_norm)
            elif not halved:
                # Under a loss scaler an overflowing step is skipped and the scale halved; the
                # halving may show on this step's report or the next one.
                rs.pending_grad = (step, t, grad_norm, scale)
        elif (
            self.nonfinite is not None
            and rs.rank in self.nonfinite.bad_ranks
            and (loss is not None or grad_norm is not None)
        ):
            self.nonfinite.bad_ranks.remove(rs.rank)

    def _seen(self, f: Facts, rank: int, step: int, t: float, what: str, value: float) -> None:
        nf = self.nonfinite
        if nf is None or (not nf.open and t - nf.last_t >= f.th.hold_s):
            self.nonfinite = NonFinite(
                first_step=step,
                first_t=t,
                first_rank=rank,
                first_field=what,
                first_value=value,
                last_step=step,
                last_t=t,
                bad_ranks=[rank],
            )
            return
        nf.last_step, nf.last_t = max(nf.last_step, step), t
        nf.count += 1
        if rank not in nf.bad_ranks:
            nf.bad_ranks.append(rank)

    def finding(self, f: Facts, now: float) -> Finding | None:
        nf = self.nonfinite
        if nf is None or not (nf.open or now - nf.last_t < f.th.hold_s):
            return None
        return nonfinite_finding(nf, self.tracer)


class Detectors:
    """One attempt's detectors and the facts they share (a new attempt: a new Detectors)."""

    def __init__(self, th: Thresholds, requested: RequestedConfig, resumed: bool) -> None:
        self.facts = Facts(th=th, requested=requested, resumed=resumed)
        self.lr = LrCheck()
        self.runaway = RunawayCheck()
        self.first_loss = FirstLossCheck()
        self.white = WhiteCheck()
        self.spike = SpikeCheck(th)
        self.divergence = DivergenceCheck(th)
        self.grad = GradCheck(th)
        self.scale = ScaleCheck()
        self.nonfinite = NonFiniteCheck()

    def observe_step(
        self,
        guard: Guard,
        rs: RankObservations,
        step: int,
        t: float,
        loss: float | None,
        grad_norm: float | None,
        lrs: Sequence[float],
        loss_scale: float | None,
    ) -> None:
        """Hand one step of rank `rs` (its figures already folded in) to the detectors that read
        it, each through `guard` under its rule's part name. The loss detectors read the primary
        rank only; the scale and finiteness checks read every rank."""
        f = self.facts
        primary = rs.rank == f.primary
        halved = guard.call(
            "sanity.loss_scale", lambda: self.scale.observe(rs, step, t, loss_scale, primary), False
        )
        guard.call(
            "sanity.nonfinite",
            lambda: self.nonfinite.observe(f, rs, step, t, loss, grad_norm, loss_scale, halved),
            None,
        )
        if not primary:
            return
        if f.first_step is None:
            f.first_step = step
        lr0 = lrs[0] if lrs else None
        rising = lr0 is not None and f.prev_lr is not None and lr0 > f.prev_lr * (1 + 1e-6)
        if lrs and f.requested.lr:
            guard.call("sanity.lr", lambda: self.lr.observe(f, step, t, lrs, rising), None)
        if lr0 is not None:
            guard.call(
                "sanity.lr_runaway", lambda: self.runaway.observe(f.th, f.requested.lr, step, t, lr0), None
            )
        if loss is not None and finite(loss):
            guard.call("sanity.loss", lambda: self._observe_loss(step, t, loss, rising), None)
        if grad_norm is not None and finite(grad_norm):
            guard.call("sanity.grad", lambda: self.grad.observe(f, step, t, grad_norm), None)
        if lr0 is not None:
            f.prev_lr = lr0

    def _observe_loss(self, step: int, t: float, loss: float, rising: bool) -> None:
        """The primary's finite losses, to each loss detector in turn."""
        for detector in (self.first_loss, self.white, self.spike, self.divergence):
            detector.observe(self.facts, step, t, loss, rising)
