"""RANK_OUTLIER: each rank held against the others (leave one out), by its loss and its step time.
Averaging across ranks hides exactly the failing rank, so the headline is the median and the
worst, and a rank that strays from the median of the others is a finding of its own.

RANK_RESTARTED: a rank died and torch elastic restarted the group (`--max-restarts`): the attempt
goes on, so no DEAD says it; the workers' restart budget (the environment each group started
with) tells one group from the next, and the first of a group to die is why it was restarted."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.robust import robust_level
from trainroom.core.health.sanity_rules import DEFAULT_THRESHOLDS, fmt_value
from trainroom.core.run.ended import how_ended
from trainroom.core.run.parts import WorkerView
from trainroom.core.run.state import RunState

# Up to this many ranks each is held against the others without it; beyond, against all of them.
LEAVE_ONE_OUT_MAX = 8


class RankObservations:
    """What the tracker keeps of one rank: its latest figures and short windows of them."""

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


def rank_deviations(
    values: Mapping[int, float], sigmas: float, rel: float, floor: float, both_sides: bool
) -> list[tuple[int, float, float, float]]:
    """(rank, value, reference, threshold) for each rank that lies outside the others.

    Each rank is held against the median of the *other* ranks (leave one out; above
    LEAVE_ONE_OUT_MAX ranks, of all of them), so with two ranks each is compared with the other.
    With two ranks only the high side counts (which of two is wrong is unknowable; the higher
    loss or slower step is the suspect)."""
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


def _others(n: int) -> str:
    if n > LEAVE_ONE_OUT_MAX:
        return f"all {n} ranks"
    return "the other rank" if n == 2 else f"the other {n - 1} ranks"


def rank_outlier_findings(
    ranks: Mapping[int, RankObservations], th: Thresholds = DEFAULT_THRESHOLDS
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
                        f"rank {r} loss {fmt_value(v)} vs {fmt_value(ref)}, the median of {others} ({v - ref:+.3g} nats; "
                        f"band ±{thr:.3g}); across "
                        f"{len(latest)} ranks the median is {fmt_value(med)} and the mean {fmt_value(mean)}, which hides it"
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


def rank_restarted(run: RunState) -> Finding | None:
    """RANK_RESTARTED: each restart of the live attempt's worker group, with the rank whose death
    caused it ("rank 1 died (killed by SIGKILL) and torchrun restarted the group, restart 1 of 3")."""
    a = run.attempt
    if a is None:
        return None
    ranks = [w for w in run.workers.values() if w.attempt == a.n and w.restarts_left is not None]
    lefts = {w.restarts_left for w in ranks if w.restarts_left is not None}
    if len(lefts) < 2:
        return None
    budget, latest = max(lefts), min(lefts)
    restarts: list[tuple[int, WorkerView | None]] = []
    for left in sorted(lefts, reverse=True)[:-1]:
        group = [w for w in ranks if w.restarts_left == left and w.ended_at is not None]
        failed = [w for w in group if w.failed] or group
        restarts.append(
            (budget - left + 1, min(failed, key=lambda w: (w.ended_at or 0.0, w.rank), default=None))
        )
    parts = []
    for n, w in restarts:
        who = (
            f"rank {w.rank} died ({how_ended(w.exit_code, w.exit_signal, unknown='how is not known')})"
            if w is not None
            else "a rank died"
        )
        parts.append(f"{who} and torchrun restarted the group, restart {n} of {budget}")
    n, w = restarts[-1]
    return Finding(
        code="RANK_RESTARTED",
        severity="warning",
        key=f"attempt-{a.n}",
        message="; ".join(parts) + f" ({latest} restart(s) left)",
        evidence={
            "attempt": a.n,
            "restarts": len(restarts),
            "max_restarts": budget,
            "restarts_left": latest,
            "rank": w.rank if w is not None else None,
            "pid": w.pid if w is not None else None,
            "exit_code": w.exit_code if w is not None else None,
            "exit_signal": w.exit_signal if w is not None else None,
            "ranks": [x.rank if x is not None else None for _, x in restarts],
        },
    )
