"""Training sanity: the watchdog tells whether the process lives, this tells whether the run learns.

Scenarios 4-8. Every rule here is a pure function of plain observations, thresholds and `now`;
`SanityTracker` only holds the bounded state those functions read, fed one step at a time by the
keeper (O(1) amortised per step, so 1000 steps/s is cheap) and asked for `findings(now)` on the
keeper's cadence (O(window + ranks) per call).

Robust statistics throughout (median and MAD, never mean and std): one absurd batch must not move
the baseline it is measured against, and averaging across ranks hides exactly the failing rank.

Codes: LR_MISMATCH, EXPLODED_START, WHITE_MODEL, LOSS_SPIKE, DIVERGENCE, GRAD_EXPLOSION,
NONFINITE, RANK_OUTLIER, and LOSS_SCALE (info: an fp16 loss-scale halving is the scaler's controlled
response to an overflow, not an incident; warning only once the scale has collapsed).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from trainroom.core import protocol as p
from trainroom.core.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.guard import Guard
from trainroom.core.health.ranks import RankObservations, rank_outlier_findings
from trainroom.core.health.robust import Rolling, finite
from trainroom.core.health.sanity_rules import (
    DEFAULT_THRESHOLDS,
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
from trainroom.core.protocol import RequestedConfig
from trainroom.core.run.figures import HeadlineLoss, headline_loss, ln_v

CODES = (
    "LR_MISMATCH",
    "EXPLODED_START",
    "WHITE_MODEL",
    "LOSS_SPIKE",
    "DIVERGENCE",
    "GRAD_EXPLOSION",
    "NONFINITE",
    "RANK_OUTLIER",
    "LOSS_SCALE",
)
LrPhase = Literal["pending", "open", "done"]


class RankRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the per-rank table."""

    rank: int
    step: int | None = None
    t: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None


class SanityTracker:
    """Bounded per-attempt state the sanity rules read. Not thread-safe: feed it from one thread
    (the keeper's loop), in arrival order.

    Per step: `observe_step` (every rank). Per trainer note: `observe_note` (the tracer's
    "nonfinite-module", the SDK's "lr-reimposed"). Per attempt: `start_attempt`, and
    `update_requested` when a Hello brings the trainer's own config. Then `findings(now)`.
    The loss detectors read the primary rank (the lowest seen, normally 0); NONFINITE reads every
    rank; RANK_OUTLIER compares ranks."""

    # The state of one attempt (see _reset).
    primary: int | None
    _ranks: dict[int, RankObservations]
    _first_step: int | None
    _prev_lr: float | None
    lr_mismatch: LrMismatch | None
    first_loss: FirstLoss | None
    white: WhiteStreak | None
    spike: Excursion | None
    _spike_cand: Excursion | None
    _chunk: list[float]
    _chunk_start: tuple[int, float] | None
    _chunk_medians: deque[tuple[float, int, float]]
    _best: tuple[float, int] | None
    divergence: Divergence | None
    grad: Excursion | None
    _grad_cand: Excursion | None
    nonfinite: NonFinite | None
    halvings: deque[ScaleHalving]
    tracer: TracerReport | None
    _lr_phase: LrPhase  # pending -> done, or pending -> open -> done
    _lr_expected: list[float]  # what reimpose_lr set per group (its note), the reference then
    _loss: Rolling
    _grad: Rolling

    def __init__(self, thresholds: Thresholds | None = None, guard: Guard | None = None) -> None:
        self.th = thresholds or DEFAULT_THRESHOLDS
        # Each rule runs through the guard: one that raises is an INTERNAL_ERROR, not the end of
        # every other rule (a frozen param group at LR 0 once raised ZeroDivisionError here).
        self.guard = guard if guard is not None else Guard()
        self.requested = RequestedConfig()
        self.resumed = False
        self.attempt_t: float | None = None
        self._reset()

    # ------------------------------------------------------------------ inputs

    def start_attempt(self, requested: RequestedConfig | None, resumed: bool, t: float | None = None) -> None:
        """A new attempt: its first step is the one LR_MISMATCH and EXPLODED_START look at.
        Everything measured so far belongs to the previous attempt and is dropped."""
        self.requested = requested or RequestedConfig()
        self.resumed = resumed
        self.attempt_t = t
        self._reset()

    def update_requested(self, config: RequestedConfig) -> None:
        """Merge what a Hello declared (the trainer's own config wins over parsed argv)."""
        r = self.requested
        self.requested = RequestedConfig(
            lr=config.lr if config.lr is not None else r.lr,
            vocab_size=config.vocab_size if config.vocab_size is not None else r.vocab_size,
            warmup_steps=config.warmup_steps if config.warmup_steps is not None else r.warmup_steps,
            arch=config.arch or r.arch,
        )

    def observe_record(self, rec: object) -> None:
        """Fold one keeper record (what it journals, in journal order): AttemptStarted starts an
        attempt (a resume when n > 1 or it names a checkpoint), and a Received Hello / Step / Note
        feeds the matching method. Anything else is ignored."""
        if isinstance(rec, p.AttemptStarted):
            self.start_attempt(rec.requested, resumed=rec.n > 1 or rec.resume_from is not None, t=rec.t)
        elif isinstance(rec, p.Received):
            msg = rec.msg
            if isinstance(msg, p.Step):
                self.observe_step(
                    rec.rank,
                    msg.step,
                    msg.t,
                    loss=msg.loss,
                    grad_norm=msg.grad_norm,
                    lrs=msg.lr,
                    loss_scale=msg.loss_scale,
                    tokens=msg.tokens,
                )
            elif isinstance(msg, p.Note):
                self.observe_note(rec.rank, msg.kind, msg.step, msg.data, msg.t)
            elif isinstance(msg, p.Hello) and (rec.rank == 0 or self.requested == RequestedConfig()):
                self.update_requested(msg.config)

    def observe_note(
        self, rank: int, kind: str, step: int | None, data: Mapping[str, object], t: float
    ) -> None:
        module = data.get("module")
        if kind == "nonfinite-module" and isinstance(module, str):
            self.tracer = TracerReport(rank=rank, step=step, t=t, module=module)
        elif kind == "lr-reimposed":
            # The trainer fixed its LR: check the next step afresh, against what reimpose_lr set
            # (the session's schedule at the restored position), not the base LR.
            self._lr_phase = "pending"
            self._lr_expected = _reimposed_lrs(data.get("groups"))

    def observe_step(
        self,
        rank: int,
        step: int,
        t: float,
        loss: float | None = None,
        grad_norm: float | None = None,
        lrs: Sequence[float] = (),
        loss_scale: float | None = None,
        tokens: int | None = None,
    ) -> None:
        th = self.th
        rs = self._ranks.get(rank)
        if rs is None:
            rs = self._ranks[rank] = RankObservations(rank, th.rank_time_window, max(1, th.rank_loss_window))
        if rs.step is not None and rs.t is not None and step > rs.step:
            rs.dts.append(max(t - rs.t, 0.0) / (step - rs.step))
        if tokens is not None:
            rs.rate_t.append(t)
            rs.rate_tok.append(tokens)
            rs.tokens = tokens
        rs.step, rs.t = step, t
        if loss is not None:
            rs.loss = loss
            if math.isfinite(loss):
                rs.losses.append(loss)
        if grad_norm is not None:
            rs.grad_norm = grad_norm
        if self.primary is None or rank < self.primary:
            self.primary = rank
        g = self.guard
        halved = g.call(
            "sanity.loss_scale",
            lambda: self._observe_scale(rs, step, t, loss_scale, rank == self.primary),
            False,
        )
        g.call(
            "sanity.nonfinite",
            lambda: self._observe_finiteness(rs, step, t, loss, grad_norm, loss_scale, halved),
            None,
        )
        if rank != self.primary:
            return
        if self._first_step is None:
            self._first_step = step
        lr0 = lrs[0] if lrs else None
        rising = lr0 is not None and self._prev_lr is not None and lr0 > self._prev_lr * (1 + 1e-6)
        if lrs and self.requested.lr:
            g.call("sanity.lr", lambda: self._observe_lr(step, t, lrs, rising), None)
        if loss is not None and finite(loss):
            g.call("sanity.loss", lambda: self._observe_loss(step, t, loss, rising), None)
        if grad_norm is not None and finite(grad_norm):
            g.call("sanity.grad", lambda: self._observe_grad(step, t, grad_norm), None)
        if lr0 is not None:
            self._prev_lr = lr0

    # ------------------------------------------------------------------ outputs

    def findings(self, now: float) -> list[Finding]:
        """The sanity findings open at `now`. Pure over the held state and `now`; each rule
        through the guard."""
        th = self.th
        g = self.guard
        out: list[Finding] = []
        rules: tuple[tuple[str, Callable[[], Finding | None]], ...] = (
            ("sanity.lr", self._lr_finding),
            ("sanity.exploded_start", self._exploded_finding),
            ("sanity.white_model", self._white_finding),
            ("sanity.loss_spike", lambda: self._spike_finding(now)),
            (
                "sanity.divergence",
                lambda: divergence_finding(self.divergence, th) if self.divergence else None,
            ),
            ("sanity.grad", lambda: self._grad_finding(now)),
            ("sanity.nonfinite", lambda: self._nonfinite_finding(now)),
            (
                "sanity.loss_scale",
                lambda: loss_scale_finding(list(self.halvings), self._primary_scale(), now, th),
            ),
        )
        for name, rule in rules:
            f = g.call(name, rule, None)
            if f is not None:
                out.append(f)
        out.extend(g.call("sanity.rank_outlier", lambda: rank_outlier_findings(self._ranks, th), []))
        return out

    def _lr_finding(self) -> Finding | None:
        return lr_mismatch_finding(self.lr_mismatch, self.th) if self.lr_mismatch is not None else None

    def _exploded_finding(self) -> Finding | None:
        req, lnv = self.requested, ln_v(self.requested.vocab_size)
        if lnv is None or self.first_loss is None or not exploded(self.first_loss.loss, lnv, self.th):
            return None
        return exploded_start_finding(self.first_loss, req.vocab_size or 0, self.th)

    def _white_finding(self) -> Finding | None:
        lnv = ln_v(self.requested.vocab_size)
        if lnv is None or self.white is None or not white_model_open(self.white, self.th):
            return None
        return white_model_finding(self.white, self.requested.vocab_size or 0, self.th)

    def _spike_finding(self, now: float) -> Finding | None:
        if self.spike is None or not excursion_open(self.spike, now, self.th):
            return None
        return loss_spike_finding(self.spike, self._loss.values[-1] if self._loss.values else None, self.th)

    def _grad_finding(self, now: float) -> Finding | None:
        if self.grad is None or not excursion_open(self.grad, now, self.th):
            return None
        return grad_explosion_finding(self.grad, self.th)

    def _nonfinite_finding(self, now: float) -> Finding | None:
        nf = self.nonfinite
        if nf is None or not (nf.open or now - nf.last_t < self.th.hold_s):
            return None
        return nonfinite_finding(nf, self.tracer)

    def rank_table(self) -> list[RankRow]:
        return [
            RankRow(
                rank=r.rank,
                step=r.step,
                t=r.t,
                loss=r.loss,
                grad_norm=r.grad_norm,
                step_time_s=r.step_time(1),
                tokens_per_s=r.tokens_per_s(),
            )
            for r in sorted(self._ranks.values(), key=lambda r: r.rank)
        ]

    def headline(self) -> HeadlineLoss:
        """The headline loss of the ranks seen (`run.figures.headline_loss`)."""
        return headline_loss({r: s.loss for r, s in self._ranks.items()})

    # ------------------------------------------------------------------ internals

    def _reset(self) -> None:
        th = self.th
        self.primary = None
        self._ranks = {}
        self._first_step = None
        self._prev_lr = None
        self._lr_phase = "pending"
        self._lr_expected = []
        self.lr_mismatch = None
        self.first_loss = None
        self.white = None
        self._loss = Rolling(th.loss_window, th.refresh_every, th.min_window, recent=th.spike_baseline_window)
        self.spike = None
        self._spike_cand = None
        self._chunk = []
        self._chunk_start = None
        self._chunk_medians = deque(maxlen=th.divergence_chunks)
        self._best = None
        self.divergence = None
        self._grad = Rolling(th.grad_window, th.refresh_every, th.min_window)
        self.grad = None
        self._grad_cand = None
        self.nonfinite = None
        self.halvings = deque(maxlen=256)
        self.tracer = None

    def _primary_scale(self) -> float | None:
        rs = self._ranks.get(self.primary) if self.primary is not None else None
        return rs.scale if rs is not None else None

    def _in_warmup(self, step: int, rising_lr: bool) -> bool:
        """A declared warmup decides; without one, an LR still rising step over step is one."""
        if self.requested.warmup_steps is not None:
            return step < self.requested.warmup_steps
        return rising_lr

    def _in_declared_warmup(self, step: int) -> bool:
        w = self.requested.warmup_steps
        return w is not None and step < w

    def _observe_lr(self, step: int, t: float, lrs: Sequence[float], rising: bool) -> None:
        req = self.requested.lr
        assert req
        if self._lr_phase == "done":
            return
        expected = self._lr_expected
        if self._lr_phase == "pending" and not expected and self._in_declared_warmup(step):
            return
        bad = lr_out_of_band(req, lrs, self.th, expected)
        if not bad:
            self.lr_mismatch, self._lr_phase = None, "done"
            return
        if self._lr_phase == "open" and self.lr_mismatch is not None:
            self.lr_mismatch.groups, self.lr_mismatch.last_step, self.lr_mismatch.last_t = bad, step, t
            return
        fresh = not expected and not self.resumed and (self._first_step or 0) <= self.th.fresh_start_max_step
        all_low = all(ratio < 1 for _, _, ratio in bad)
        if fresh and all_low and (self._prev_lr is None or rising):
            # Maybe an undeclared warmup on a start from scratch: wait while the LR still rises.
            return
        self.lr_mismatch = LrMismatch(
            step=step,
            t=t,
            requested=req,
            groups=bad,
            resumed=self.resumed,
            fresh=fresh,
            last_step=step,
            last_t=t,
            expected=list(expected),
        )
        self._lr_phase = "open"

    def _observe_loss(self, step: int, t: float, loss: float, rising_lr: bool) -> None:
        th = self.th
        if self.first_loss is None:
            self.first_loss = FirstLoss(step=step, t=t, loss=loss)
        lnv = ln_v(self.requested.vocab_size)
        if lnv is not None:
            if abs(loss - lnv) > th.white_band * lnv:
                self.white = None
            elif not self._in_warmup(step, rising_lr):
                w = self.white
                if w is None:
                    w = self.white = WhiteStreak(start_step=step, start_t=t, last_step=step, last_t=t)
                w.last_step, w.last_t = step, t
                w.n += 1
                w.total += loss
        # Spike: against the level of the window *before* this value.
        level = self._loss.level
        if level is not None:
            med, sigma = level
            thr = max(th.spike_sigmas * sigma, th.spike_min_rel * abs(med), th.spike_min_nats)
            self.spike, self._spike_cand = advance_excursion(
                self.spike,
                self._spike_cand,
                step,
                t,
                loss,
                med,
                thr,
                immediate=th.spike_immediate * thr,
                confirm=th.confirm_steps,
            )
        self._loss.append(loss)
        # Divergence: medians of consecutive chunks against the attempt's best chunk.
        if self._chunk_start is None:
            self._chunk_start = (step, t)
        self._chunk.append(loss)
        if len(self._chunk) >= th.divergence_chunk:
            m = statistics.median(self._chunk)
            start_step, start_t = self._chunk_start
            self._chunk.clear()
            self._chunk_start = None
            self._chunk_medians.append((m, start_step, start_t))
            if self._best is None or m < self._best[0]:
                self._best = (m, start_step)
            self.divergence = divergence_state(list(self._chunk_medians), self._best, step, th)

    def _observe_grad(self, step: int, t: float, g: float) -> None:
        th = self.th
        level = self._grad.level
        if level is not None:
            med, sigma = level
            thr = max(med * (th.grad_ratio - 1), th.grad_sigmas * sigma)
            self.grad, self._grad_cand = advance_excursion(
                self.grad,
                self._grad_cand,
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
            # No history yet: only the absolute cap can tell (a grad norm of 10^18 from the first step).
            self.grad, self._grad_cand = advance_excursion(
                self.grad, None, step, t, g, 0.0, math.inf, cap=th.grad_abs_max
            )
        self._grad.append(g)

    def _observe_scale(
        self, rs: RankObservations, step: int, t: float, scale: float | None, primary: bool
    ) -> bool:
        if scale is None or not math.isfinite(scale):
            return False
        halved = rs.scale is not None and scale < rs.scale
        if halved and primary:
            assert rs.scale is not None
            self.halvings.append(ScaleHalving(step=step, t=t, old=rs.scale, new=scale))
        rs.scale = scale
        return halved

    def _observe_finiteness(
        self,
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
                self._nonfinite(rs.rank, pend[0], pend[1], "grad_norm", pend[2])
        bad_loss = loss is not None and not math.isfinite(loss)
        bad_grad = grad_norm is not None and not math.isfinite(grad_norm)
        if bad_loss:
            assert loss is not None
            self._nonfinite(rs.rank, step, t, "loss", loss)
        elif bad_grad:
            assert grad_norm is not None
            if scale is None:
                self._nonfinite(rs.rank, step, t, "grad_norm", grad_norm)
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

    def _nonfinite(self, rank: int, step: int, t: float, what: str, value: float) -> None:
        nf = self.nonfinite
        if nf is None or (not nf.open and t - nf.last_t >= self.th.hold_s):
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


def _reimposed_lrs(groups: object) -> list[float]:
    """The per-group LRs an "lr-reimposed" note says reimpose_lr set (`groups[i].new`); empty
    when the note does not carry them all as positive finite numbers (an older SDK)."""
    if not isinstance(groups, list) or not groups:
        return []
    out = []
    for g in groups:
        new = g.get("new") if isinstance(g, dict) else None
        if isinstance(new, bool) or not isinstance(new, (int, float)) or not finite(new) or new <= 0:
            return []
        out.append(float(new))
    return out
