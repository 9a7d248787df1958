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

import itertools
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.protocol import RequestedConfig

# Up to this many ranks each is held against the others without it; beyond, against all of them.
LEAVE_ONE_OUT_MAX = 8
# MAD x 1.4826 estimates the standard deviation of normal noise, so the thresholds read as sigmas.
MAD_TO_SIGMA = 1.4826

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

REIMPOSE_HINT = "call trainroom.core.lr.reimpose_lr(optimizer, scheduler, lr) after loading the checkpoint"


DEFAULT_THRESHOLDS = Thresholds()


# ============================================================== pure helpers (plain inputs)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def robust_level(values: Sequence[float]) -> tuple[float, float]:
    """(median, sigma from the MAD) of `values` (non-empty, finite)."""
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    return med, MAD_TO_SIGMA * mad


def trend_robust_level(values: Sequence[float], recent: int) -> tuple[float, float]:
    """(median of the latest `recent` values, noise sigma from the MAD of successive differences)
    of `values` (at least two, finite). The difference of two noisy values has sqrt(2) x the
    noise, and a smooth trend only shifts the differences' median, which the MAD removes."""
    vals = list(values)
    base = statistics.median(vals[-recent:] if recent > 0 else vals)
    diffs = [b - a for a, b in itertools.pairwise(vals)]
    dmed = statistics.median(diffs)
    mad = statistics.median([abs(d - dmed) for d in diffs])
    return base, MAD_TO_SIGMA * mad / math.sqrt(2)


def ln_vocab(vocab_size: int | None) -> float | None:
    """The uniform-guess loss ln V in nats; None when V is unknown (or nonsense)."""
    if vocab_size is None or vocab_size < 2:
        return None
    return math.log(vocab_size)


def headline_loss(
    per_rank_losses: Mapping[int, float | None],
) -> tuple[float | None, int | None, float | None]:
    """(median, worst rank, worst loss) across ranks: the headline is the median with the worst rank
    beside it, never only the mean (one failed rank of 64 moves the mean by half a nat and hides).
    A non-finite loss is the worst there is; the median is taken over the finite ones."""
    vals = {r: v for r, v in per_rank_losses.items() if v is not None}
    if not vals:
        return None, None, None
    good = [v for v in vals.values() if math.isfinite(v)]
    med = statistics.median(good) if good else math.nan
    worst_rank = max(
        vals, key=lambda r: (not math.isfinite(vals[r]), vals[r] if math.isfinite(vals[r]) else 0.0, -r)
    )
    return med, worst_rank, vals[worst_rank]


def lr_out_of_band(
    requested: float, effective: Sequence[float], th: Thresholds = DEFAULT_THRESHOLDS
) -> list[tuple[int, float, float]]:
    """(group, effective, ratio) for each param group whose effective LR lies outside
    [requested / lr_too_low_ratio, requested x lr_too_high_ratio]."""
    out: list[tuple[int, float, float]] = []
    for i, eff in enumerate(effective):
        if not finite(eff):
            continue
        ratio = eff / requested
        if ratio < 1 / th.lr_too_low_ratio or ratio > th.lr_too_high_ratio:
            out.append((i, eff, ratio))
    return out


def rank_deviations(
    values: Mapping[int, float], sigmas: float, rel: float, floor: float, both_sides: bool
) -> list[tuple[int, float, float, float]]:
    """(rank, value, reference, threshold) for each rank that lies outside the others.

    Each rank is held against the median of the *other* ranks (leave one out; above
    LEAVE_ONE_OUT_MAX ranks, of all of them), so with two ranks each is compared with the other. With two ranks only the high side
    counts (which of two is wrong is unknowable; the higher loss or slower step is the suspect)."""
    out: list[tuple[int, float, float, float]] = []
    if len(values) < 2:
        return out
    two_sided = both_sides and len(values) >= 3
    # Past a handful of ranks one rank barely moves the median or the MAD: one pass for all.
    shared = robust_level(list(values.values())) if len(values) > LEAVE_ONE_OUT_MAX else None
    for r, v in values.items():
        if shared is not None:
            ref, sigma = shared
        else:
            others = [x for q, x in values.items() if q != r]
            ref, sigma = robust_level(others) if len(others) >= 2 else (others[0], 0.0)
        thr = max(sigmas * sigma, rel * abs(ref), floor)
        dev = v - ref
        if dev > thr or (two_sided and -dev > thr):
            out.append((r, v, ref, thr))
    return out


def _fmt(x: float | None) -> str:
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


class RankRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of the per-rank table."""

    rank: int
    step: int | None = None
    t: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None


class _RankState:
    __slots__ = (
        "dts",
        "grad_norm",
        "loss",
        "losses",
        "pending_grad",
        "rank",
        "rate_t",
        "rate_tok",
        "scale",
        "step",
        "t",
        "tokens",
    )

    def __init__(self, rank: int, window: int, loss_window: int) -> None:
        self.rank = rank
        self.step: int | None = None
        self.t: float | None = None
        self.loss: float | None = None
        self.grad_norm: float | None = None
        self.tokens: int | None = None
        self.dts: deque[float] = deque(maxlen=window)
        self.rate_t: deque[float] = deque(maxlen=window)
        self.rate_tok: deque[int] = deque(maxlen=window)
        self.scale: float | None = None
        # A non-finite grad norm under a loss scaler waits one step: a halving means overflow.
        self.pending_grad: tuple[int, float, float, float | None] | None = None  # step, t, value, scale
        self.losses: deque[float] = deque(maxlen=loss_window)

    def step_time(self, min_samples: int) -> float | None:
        return statistics.median(self.dts) if len(self.dts) >= min_samples else None

    def tokens_per_s(self) -> float | None:
        if len(self.rate_t) < 2 or self.rate_t[-1] <= self.rate_t[0]:
            return None
        return (self.rate_tok[-1] - self.rate_tok[0]) / (self.rate_t[-1] - self.rate_t[0])


class _Rolling:
    """A bounded window with a cached (median, sigma), re-sorted every `refresh` appends."""

    __slots__ = ("_since", "level", "min_n", "recent", "refresh", "values")

    def __init__(self, size: int, refresh: int, min_n: int, recent: int | None = None) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self.refresh = max(1, refresh)
        self.min_n = max(2, min_n)
        self._since = 0
        self.level: tuple[float, float] | None = None
        # None: (median, MAD sigma) of the window; else trend_robust_level with this recent part.
        self.recent = recent

    def append(self, v: float) -> None:
        self.values.append(v)
        self._since += 1
        if len(self.values) >= self.min_n and (self.level is None or self._since >= self.refresh):
            self.level = (
                robust_level(self.values)
                if self.recent is None
                else trend_robust_level(self.values, self.recent)
            )
            self._since = 0


# ============================================================== the tracker


class SanityTracker:
    """Bounded per-attempt state the sanity rules read. Not thread-safe: feed it from one thread
    (the keeper's loop), in arrival order.

    Per step: `observe_step` (every rank). Per trainer note: `observe_note` (the tracer's
    "nonfinite-module", the SDK's "lr-reimposed"). Per attempt: `start_attempt`, and
    `update_requested` when a Hello brings the trainer's own config. Then `findings(now)`.
    The loss detectors read the primary rank (the lowest seen, normally 0); NONFINITE reads every
    rank; RANK_OUTLIER compares ranks."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or DEFAULT_THRESHOLDS
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

    def observe_record(self, rec: Any) -> None:
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

    def observe_note(self, rank: int, kind: str, step: int | None, data: Mapping[str, Any], t: float) -> None:
        if kind == "nonfinite-module" and isinstance(data.get("module"), str):
            self.tracer = TracerReport(rank=rank, step=step, t=t, module=data["module"])
        elif kind == "lr-reimposed":
            # The trainer fixed its LR: check the next step afresh.
            self._lr_phase = "pending"

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
            rs = self._ranks[rank] = _RankState(rank, th.rank_time_window, max(1, th.rank_loss_window))
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
        halved = self._observe_scale(rs, step, t, loss_scale, rank == self.primary)
        self._observe_finiteness(rs, step, t, loss, grad_norm, loss_scale, halved)
        if rank != self.primary:
            return
        if self._first_step is None:
            self._first_step = step
        lr0 = lrs[0] if lrs else None
        rising = lr0 is not None and self._prev_lr is not None and lr0 > self._prev_lr * (1 + 1e-6)
        if lrs and self.requested.lr:
            self._observe_lr(step, t, lrs, rising)
        if finite(loss):
            assert loss is not None
            self._observe_loss(step, t, loss, rising)
        if finite(grad_norm):
            assert grad_norm is not None
            self._observe_grad(step, t, grad_norm)
        if lr0 is not None:
            self._prev_lr = lr0

    # ------------------------------------------------------------------ outputs

    def findings(self, now: float) -> list[Finding]:
        """The sanity findings open at `now`. Pure over the held state and `now`."""
        th = self.th
        out: list[Finding] = []
        req = self.requested
        if self.lr_mismatch is not None:
            out.append(lr_mismatch_finding(self.lr_mismatch, th))
        lnv = ln_vocab(req.vocab_size)
        if lnv is not None and self.first_loss is not None and exploded(self.first_loss.loss, lnv, th):
            out.append(exploded_start_finding(self.first_loss, req.vocab_size or 0, th))
        if lnv is not None and self.white is not None and white_model_open(self.white, th):
            out.append(white_model_finding(self.white, req.vocab_size or 0, th))
        if self.spike is not None and excursion_open(self.spike, now, th):
            out.append(
                loss_spike_finding(self.spike, self._loss.values[-1] if self._loss.values else None, th)
            )
        if self.divergence is not None:
            out.append(divergence_finding(self.divergence, th))
        if self.grad is not None and excursion_open(self.grad, now, th):
            out.append(grad_explosion_finding(self.grad, th))
        if self.nonfinite is not None and (self.nonfinite.open or now - self.nonfinite.last_t < th.hold_s):
            out.append(nonfinite_finding(self.nonfinite, self.tracer))
        f = loss_scale_finding(list(self.halvings), self._primary_scale(), now, th)
        if f is not None:
            out.append(f)
        out.extend(rank_outlier_findings(self._ranks, th))
        return out

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

    def headline(self) -> tuple[float | None, int | None, float | None]:
        return headline_loss({r: s.loss for r, s in self._ranks.items()})

    # ------------------------------------------------------------------ internals

    def _reset(self) -> None:
        th = self.th
        self.primary: int | None = None
        self._ranks: dict[int, _RankState] = {}
        self._first_step: int | None = None
        self._prev_lr: float | None = None
        self._lr_phase = "pending"  # pending -> done, or pending -> open -> done
        self.lr_mismatch: LrMismatch | None = None
        self.first_loss: FirstLoss | None = None
        self.white: WhiteStreak | None = None
        self._loss = _Rolling(
            th.loss_window, th.refresh_every, th.min_window, recent=th.spike_baseline_window
        )
        self.spike: Excursion | None = None
        self._spike_cand: Excursion | None = None
        self._chunk: list[float] = []
        self._chunk_start: tuple[int, float] | None = None
        self._chunk_medians: deque[tuple[float, int, float]] = deque(maxlen=th.divergence_chunks)
        self._best: tuple[float, int] | None = None
        self.divergence: Divergence | None = None
        self._grad = _Rolling(th.grad_window, th.refresh_every, th.min_window)
        self.grad: Excursion | None = None
        self._grad_cand: Excursion | None = None
        self.nonfinite: NonFinite | None = None
        self.halvings: deque[ScaleHalving] = deque(maxlen=256)
        self.tracer: TracerReport | None = None

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
        if self._lr_phase == "pending" and self._in_declared_warmup(step):
            return
        bad = lr_out_of_band(req, lrs, self.th)
        if not bad:
            self.lr_mismatch, self._lr_phase = None, "done"
            return
        if self._lr_phase == "open" and self.lr_mismatch is not None:
            self.lr_mismatch.groups, self.lr_mismatch.last_step, self.lr_mismatch.last_t = bad, step, t
            return
        fresh = not self.resumed and (self._first_step or 0) <= self.th.fresh_start_max_step
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
        )
        self._lr_phase = "open"

    def _observe_loss(self, step: int, t: float, loss: float, rising_lr: bool) -> None:
        th = self.th
        if self.first_loss is None:
            self.first_loss = FirstLoss(step=step, t=t, loss=loss)
        lnv = ln_vocab(self.requested.vocab_size)
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
            # No history yet: only the absolute cap can tell (the seed's 10^18 from the first step).
            self.grad, self._grad_cand = advance_excursion(
                self.grad, None, step, t, g, 0.0, math.inf, cap=th.grad_abs_max
            )
        self._grad.append(g)

    def _observe_scale(self, rs: _RankState, step: int, t: float, scale: float | None, primary: bool) -> bool:
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
        rs: _RankState,
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


# ============================================================== per-code rules (pure)


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
) -> Divergence | None:
    """Divergence when the last `divergence_chunks` chunk medians all sit above the best chunk
    median of the attempt by more than the band: the trajectory stopped coming back."""
    if len(medians) < th.divergence_chunks:
        return None
    b, b_step = best
    band = max(th.divergence_rel * abs(b), th.divergence_min_nats)
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
    )


def lr_mismatch_finding(m: LrMismatch, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    worst = max(m.groups, key=lambda g: abs(math.log(g[2])) if g[2] > 0 else math.inf)
    group, eff, ratio = worst
    low = ratio < 1
    factor = (1 / ratio) if low else ratio
    where = "the first step after the resume" if m.resumed else "the first step of this attempt"
    if m.fresh:
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
    groups = ", ".join(f"group {g} {_fmt(e)} (x{_fmt(r)})" for g, e, r in m.groups)
    msg = (
        f"effective LR {_fmt(eff)} vs requested {_fmt(m.requested)}: {factor:.3g}x "
        f"{'below' if low else 'above'} (ratio {_fmt(ratio)}) on {where} (step {m.step}); "
        f"likely cause: {cause}"
    )
    if len(m.groups) > 1:
        msg += f" [{groups}]"
    return Finding(
        code="LR_MISMATCH",
        severity="warning",
        message=msg,
        evidence={
            "requested": m.requested,
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
    lnv = math.log(vocab_size)
    return Finding(
        code="EXPLODED_START",
        severity="warning",
        action="verify",
        message=(
            f"first loss {_fmt(first.loss)} at step {first.step} vs ln V = {lnv:.3f} (V = {vocab_size}): "
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
    lnv = math.log(vocab_size)
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
        state = f"not recovered: {_fmt(latest)} at step {s.last_step}, {s.last_step - s.start_step} steps on"
    more = f"; {s.count} spikes this attempt" if s.count > 1 else ""
    return Finding(
        code="LOSS_SPIKE",
        severity="info" if s.recovered_step is not None else "warning",
        message=(
            f"loss spike at step {s.start_step}: {_fmt(s.baseline)} -> {_fmt(s.peak)} (+{size:.3g} nats over "
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
            f"rolling median loss {_fmt(cur)} has stayed above the attempt's best {_fmt(d.best)} (step "
            f"{d.best_step}) + band {d.band:.3g} for {len(d.medians)} windows of {th.divergence_chunk} "
            f"steps since step {d.since_step}, {trend} ({_fmt(d.medians[0])} -> {_fmt(cur)}): the trajectory "
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
        },
    )


def grad_explosion_finding(g: Excursion, th: Thresholds = DEFAULT_THRESHOLDS) -> Finding:
    ratio = g.peak / g.baseline if g.baseline > 0 else math.inf
    if g.recovered_step is not None:
        state = f"back in range at step {g.recovered_step}"
    else:
        state = f"still {_fmt(g.last)} at step {g.last_step}"
    ref = (
        f"{ratio:.3g}x its median {_fmt(g.baseline)} over the last {th.grad_window} steps"
        if g.baseline > 0
        else f"above the absolute cap {_fmt(th.grad_abs_max)} before any history"
    )
    return Finding(
        code="GRAD_EXPLOSION",
        severity="info" if g.recovered_step is not None else "warning",
        message=(
            f"grad norm {_fmt(g.peak)} at step {g.peak_step} (10^{math.log10(g.peak):.0f}), {ref}; {state}"
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
        msg += "; turn on trainroom.core.tracer.NonFiniteTracer(model) to name the first non-finite module"
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
            f"loss scale collapsed to {_fmt(scale)} (floor {_fmt(th.loss_scale_floor)}): the scaler "
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


def _others(n: int) -> str:
    if n > LEAVE_ONE_OUT_MAX:
        return f"all {n} ranks"
    return "the other rank" if n == 2 else f"the other {n - 1} ranks"


def rank_outlier_findings(
    ranks: Mapping[int, _RankState], th: Thresholds = DEFAULT_THRESHOLDS
) -> list[Finding]:
    out: list[Finding] = []
    latest = {r: s.loss for r, s in ranks.items() if s.loss is not None and math.isfinite(s.loss)}
    smooth = {r: statistics.median(s.losses) for r, s in ranks.items() if s.losses}
    n = len(ranks)
    if len(latest) >= 2:
        mean = statistics.fmean(latest.values())
        med = statistics.median(latest.values())
        flagged = {
            d[0]: d
            for d in rank_deviations(smooth, th.rank_sigmas, th.rank_loss_rel, th.rank_loss_min_nats, True)
        }
        for d in rank_deviations(
            latest,
            th.rank_sigmas * th.rank_immediate,
            th.rank_loss_rel * th.rank_immediate,
            th.rank_loss_min_nats * th.rank_immediate,
            True,
        ):
            flagged.setdefault(d[0], d)
        others = _others(len(latest))
        for r, v, ref, thr in sorted(flagged.values()):
            out.append(
                Finding(
                    code="RANK_OUTLIER",
                    severity="warning",
                    key=f"{r}/loss",
                    message=(
                        f"rank {r} loss {_fmt(v)} vs {_fmt(ref)}, the median of {others} ({v - ref:+.3g} nats; "
                        f"band ±{thr:.3g}); across "
                        f"{len(latest)} ranks the median is {_fmt(med)} and the mean {_fmt(mean)}, which hides it"
                    ),
                    evidence={
                        "rank": r,
                        "metric": "loss",
                        "value": v,
                        "reference": ref,
                        "threshold": thr,
                        "ranks": n,
                        "median": med,
                        "mean": mean,
                        "step": ranks[r].step,
                    },
                )
            )
    times = {r: st for r, s in ranks.items() if (st := s.step_time(th.rank_time_min_samples)) is not None}
    if len(times) >= 2:
        for r, v, ref, thr in rank_deviations(
            times, th.rank_sigmas, th.rank_time_rel, th.rank_time_min_s, False
        ):
            out.append(
                Finding(
                    code="RANK_OUTLIER",
                    severity="warning",
                    key=f"{r}/step-time",
                    message=(
                        f"rank {r} step time {v:.3g} s vs {ref:.3g} s, the median of {_others(len(times))} "
                        f"({v / ref if ref > 0 else math.inf:.3g}x): a straggler"
                    ),
                    evidence={
                        "rank": r,
                        "metric": "step_time_s",
                        "value": v,
                        "reference": ref,
                        "threshold": thr,
                        "ranks": n,
                        "step": ranks[r].step,
                    },
                )
            )
    return out
