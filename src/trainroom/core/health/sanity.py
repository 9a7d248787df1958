"""Training sanity: the watchdog tells whether the process lives, this tells whether the run learns.

Each sanity finding has its own detector (`detectors`: its own small state, an `observe` and a
pure `finding`), listed once in `rules.SANITY`. `SanityTracker` is only the feeder: it keeps one
attempt's `Detectors`, folds each step into the ranks' figures and hands it to the detectors that
read it (O(1) amortised per step, so 1000 steps/s is cheap), and asks the rules for their
findings on the keeper's cadence (O(window + ranks) per call).

Robust statistics throughout (median and MAD, never mean and std): one absurd batch must not move
the baseline it is measured against, and averaging across ranks hides exactly the failing rank.

Codes: LR_MISMATCH, EXPLODED_START, WHITE_MODEL, LOSS_SPIKE, DIVERGENCE, GRAD_EXPLOSION,
NONFINITE, RANK_OUTLIER, and LOSS_SCALE (info: an fp16 loss-scale halving is the scaler's controlled
response to an overflow, not an incident; warning only once the scale has collapsed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trainroom.core import vocab
from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.detectors import Detectors, Facts
from trainroom.core.health.guard import Guard
from trainroom.core.health.ranks import RankObservations
from trainroom.core.health.robust import finite
from trainroom.core.health.rules import SANITY, judge
from trainroom.core.health.sanity_rules import DEFAULT_THRESHOLDS, TracerReport
from trainroom.core.run.figures import HeadlineLoss, headline_loss
from trainroom.core.wire import protocol as p
from trainroom.core.wire.protocol import RequestedConfig

CODES = vocab.SANITY_CODES


class SanityTracker:
    """Feeds one attempt's detectors. Not thread-safe: feed it from one thread (the keeper's
    loop), in arrival order.

    Per step: `observe_step` (every rank). Per trainer note: `observe_note` (the tracer's
    "nonfinite-module", the SDK's "lr-reimposed"). Per attempt: `start_attempt`, and
    `update_requested` when a Hello brings the trainer's own config. Then `findings(now)`.
    The loss detectors read the primary rank (the lowest seen, normally 0); NONFINITE reads every
    rank; RANK_OUTLIER compares ranks."""

    def __init__(self, thresholds: Thresholds | None = None, guard: Guard | None = None) -> None:
        self.th = thresholds or DEFAULT_THRESHOLDS
        # Each detector runs through the guard: one that raises is an INTERNAL_ERROR, not the end
        # of every other (a frozen param group at LR 0 once raised ZeroDivisionError here).
        self.guard = guard if guard is not None else Guard()
        self.attempt_t: float | None = None
        self.detectors = Detectors(self.th, RequestedConfig(), resumed=False)

    @property
    def facts(self) -> Facts:
        return self.detectors.facts

    @property
    def requested(self) -> RequestedConfig:
        return self.detectors.facts.requested

    # ------------------------------------------------------------------ inputs

    def start_attempt(self, requested: RequestedConfig | None, resumed: bool, t: float | None = None) -> None:
        """A new attempt: its first step is the one LR_MISMATCH and EXPLODED_START look at.
        Everything measured so far belongs to the previous attempt and is dropped."""
        self.attempt_t = t
        self.detectors = Detectors(self.th, requested or RequestedConfig(), resumed)

    def update_requested(self, config: RequestedConfig) -> None:
        """Merge what a Hello declared (the trainer's own config wins over parsed argv)."""
        f = self.facts
        r = f.requested
        f.requested = RequestedConfig(
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
            self.detectors.nonfinite.traced(TracerReport(rank=rank, step=step, t=t, module=module))
        elif kind == "lr-reimposed":
            # The trainer fixed its LR: check the next step afresh, against what reimpose_lr set
            # (the session's schedule at the restored position), not the base LR.
            self.detectors.lr.reimposed(_reimposed_lrs(data.get("groups")))

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
        d = self.detectors
        f = d.facts
        rs = f.ranks.get(rank)
        if rs is None:
            rs = f.ranks[rank] = RankObservations(rank, th.rank_time_window, max(1, th.rank_loss_window))
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
        if f.primary is None or rank < f.primary:
            f.primary = rank
        d.observe_step(self.guard, rs, step, t, loss, grad_norm, lrs, loss_scale)

    # ------------------------------------------------------------------ outputs

    def findings(self, now: float) -> list[Finding]:
        """The sanity findings open at `now`: every rule of `rules.SANITY`, each through the
        guard."""
        return judge(self.guard, SANITY, self.detectors, now)

    def headline(self) -> HeadlineLoss:
        """The headline loss of the ranks seen (`run.figures.headline_loss`)."""
        return headline_loss({r: s.loss for r, s in self.facts.ranks.items()})


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
