"""Plot series for the control room: loss, LR, grad norm and step time against tokens.

Against tokens, not wall time: a restart, a stall or a slow night must not bend the curve, and two
attempts of one run line up where they saw the same data. Storage is bounded: points fall into
uniform buckets over x that keep min, max, sum and count per metric; when the buckets run out,
neighbours merge in pairs and the bucket width doubles, so a day-long run at 1000 steps/s stays at
most `max_buckets` wide and no spike is lost (a bucket's max is the max of its points). A point
whose x lies in the past (a resume replays steps since the checkpoint) lands in its own bucket.

Marks (checkpoint, restart, lr-change, loss-scale) sit at an x on the same axis; marks of one kind
in one bucket fold into one with a count. `snapshot()` gives a msgspec Struct holding only the
non-empty buckets, which goes into what a client receives; `Series.from_snapshot` rebuilds the
store so a client can keep folding live steps on top.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from trainroom.core.run.figures import ln_v
from trainroom.core.run.vitals import VitalsHistory
from trainroom.core.samples import VitalsSample
from trainroom.core.vocab import MarkKind
from trainroom.core.wire import protocol as p

METRICS = ("loss", "lr", "grad_norm", "step_time")
XUnit = Literal["tokens", "steps"]

# An LR change is marked when it jumps by this factor in one step after a flat stretch: a StepLR
# milestone or a re-imposed LR, not the smooth slope of a warmup or a cosine tail.
LR_JUMP = 1.5
LR_FLAT = 0.01
T = TypeVar("T")


class Mark(msgspec.Struct, kw_only=True, omit_defaults=True):
    kind: MarkKind
    x: float
    step: int | None = None
    label: str = ""
    count: int = 1  # marks of this kind folded into this one (same bucket)


class Column(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One metric over the non-empty buckets of a snapshot; None where a bucket has no value."""

    lo: list[float | None] = []
    hi: list[float | None] = []
    mean: list[float | None] = []
    n: list[int] = []
    nonfinite: list[int] = []  # NaN/Inf values per bucket (not in lo/hi/mean); empty when none


class SeriesSnapshot(msgspec.Struct, kw_only=True, omit_defaults=True):
    x_unit: str = "tokens"
    x0: float = 0.0
    width: float = 0.0  # bucket width in x units (0 before two distinct x were seen)
    index: list[int] = []  # bucket index of each entry: x0 + index * width is where it starts
    x_lo: list[float] = []  # the smallest and largest x that fell in each bucket
    x_hi: list[float] = []
    points: list[int] = []
    loss: Column = msgspec.field(default_factory=Column)
    lr: Column = msgspec.field(default_factory=Column)
    grad_norm: Column = msgspec.field(default_factory=Column)
    step_time: Column = msgspec.field(default_factory=Column)
    marks: list[Mark] = []
    loss_baseline: float | None = None  # ln V, drawn as a line on the loss plot when V is known
    total_points: int = 0
    max_buckets: int = 2000
    vitals: list[VitalsSample] = []  # the history graphs' samples (run.vitals)

    def centres(self) -> list[float]:
        return [(a + b) / 2 for a, b in zip(self.x_lo, self.x_hi, strict=True)]


class SeriesState(msgspec.Struct, kw_only=True, omit_defaults=True, array_like=True):
    """Everything a Series holds, exactly (the sums too, not means): what a journal snapshot
    keeps, so a reader that resumes folding from it ends where a fold from the start would.
    Buckets past `used` are empty and not kept."""

    max_buckets: int
    max_marks: int
    x_unit: str | None
    x0: float | None
    width: float
    used: int
    total_points: int
    loss_baseline: float | None
    marks: list[Mark]
    pending: list[Mark]
    xlo: list[float]
    xhi: list[float]
    pts: list[int]
    lo: list[list[float]]
    hi: list[list[float]]
    sums: list[list[float]]
    cnt: list[list[int]]
    bad: list[list[int]]
    last_x: float | None
    last_step: int | None
    last_t: float | None
    tok_step: tuple[int, float] | None
    tok_rate: float | None
    lr: float | None
    lr_flat: bool
    scale: float | None
    vitals: list[VitalsSample] = []


def _log_step(msg: object) -> bool:
    """A step read from the log: the one rank that prints them on its node (rank 1 where that
    node's only worker is rank 1) draws the curve."""
    return isinstance(msg, p.Step) and msg.source == "log"


class Series:
    """The bounded store. `observe_step` is the hot path (one call per reported step); not
    thread-safe: feed it from one thread."""

    def __init__(self, max_buckets: int = 2000, max_marks: int = 500) -> None:
        if max_buckets < 4 or max_buckets % 2:
            raise ValueError("max_buckets must be an even number >= 4")
        self.max_buckets = max_buckets
        self.max_marks = max_marks
        self.x_unit: XUnit | None = None
        self.x0: float | None = None
        self.width = 0.0
        self.used = 0  # buckets 0..used-1 may hold points
        self.total_points = 0
        self.loss_baseline: float | None = None
        self.marks: list[Mark] = []
        self._pending: list[Mark] = []  # restart marks wait for the first point of the attempt
        n = max_buckets
        self._xlo = [math.inf] * n
        self._xhi = [-math.inf] * n
        self._pts = [0] * n
        self._lo = [[math.inf] * n for _ in METRICS]
        self._hi = [[-math.inf] * n for _ in METRICS]
        self._sum = [[0.0] * n for _ in METRICS]
        self._cnt = [[0] * n for _ in METRICS]
        self._bad = [[0] * n for _ in METRICS]
        self._last_x: float | None = None
        self._last_step: int | None = None
        self._last_t: float | None = None
        self._tok_step: tuple[int, float] | None = None  # (step, tokens) of the last point with tokens
        self._tok_rate: float | None = None  # tokens per step, to place a point that lacks tokens
        self._lr: float | None = None
        self._lr_flat = False
        self._scale: float | None = None
        self.vitals = VitalsHistory()  # the history graphs: host, GPU, CPU and disk over the run

    # ------------------------------------------------------------------ inputs

    def set_loss_baseline(self, vocab_size: int | None) -> None:
        self.loss_baseline = ln_v(vocab_size)

    def observe_step(
        self,
        step: int,
        t: float | None = None,
        tokens: int | None = None,
        loss: float | None = None,
        lr: float | Sequence[float] | None = None,
        grad_norm: float | None = None,
        step_time: float | None = None,
        loss_scale: float | None = None,
    ) -> None:
        """One step. `lr` is the first param group's (a list is accepted); `step_time` is
        derived from `t` and the previous step when not given."""
        x = self._x_of(step, tokens)
        last_t, last_step = self._last_t, self._last_step
        if (
            step_time is None
            and t is not None
            and last_t is not None
            and last_step is not None
            and step > last_step
        ):
            step_time = max(t - last_t, 0.0) / (step - last_step)
        self._last_t, self._last_step = t, step
        lr0 = lr if lr is None or isinstance(lr, (int, float)) else (lr[0] if len(lr) else None)
        if self._pending:
            for m in self._pending:
                m.x = x
                self._add_mark(m)
            self._pending.clear()
        if lr0 is not None and math.isfinite(lr0):
            prev = self._lr
            if prev is not None and prev > 0 and lr0 > 0:
                r = lr0 / prev
                if self._lr_flat and (r >= LR_JUMP or r <= 1 / LR_JUMP):
                    self._add_mark(
                        Mark(kind="lr-change", x=x, step=step, label=f"lr {prev:.3g} -> {lr0:.3g}")
                    )
                self._lr_flat = abs(r - 1) <= LR_FLAT
            self._lr = lr0
        if loss_scale is not None and math.isfinite(loss_scale):
            if self._scale is not None and loss_scale < self._scale:
                self._add_mark(
                    Mark(
                        kind="loss-scale",
                        x=x,
                        step=step,
                        label=f"loss scale {self._scale:.6g} -> {loss_scale:.6g}",
                    )
                )
            self._scale = loss_scale
        self._add(x, (loss, lr0, grad_norm, step_time))

    def observe_record(self, rec: Any) -> None:
        """Fold one keeper record (what it journals, in order): rank 0's steps (or the log's) are
        the curve, a new attempt is a restart mark, a verified checkpoint and a re-imposed LR are
        marks, and a known vocab size draws ln V; a Vitals record goes to the history graphs.
        Anything else is ignored."""
        if isinstance(rec, p.Vitals):
            self.vitals.add(rec.v)
            return
        if isinstance(rec, p.AttemptStarted):
            if rec.n > 1:
                self.mark("restart", label=f"attempt {rec.n}")
            if rec.requested.vocab_size:
                self.set_loss_baseline(rec.requested.vocab_size)
        elif isinstance(rec, p.Received) and (rec.rank == 0 or _log_step(rec.msg)):
            msg = rec.msg
            if isinstance(msg, p.Step):
                self.observe_step(
                    msg.step,
                    t=msg.t,
                    tokens=msg.tokens,
                    loss=msg.loss,
                    lr=msg.lr or None,
                    grad_norm=msg.grad_norm,
                    loss_scale=msg.loss_scale,
                )
            elif isinstance(msg, p.Note) and msg.kind == "lr-reimposed" and msg.data.get("changes", True):
                # (a note that lists no changes says the LR was already right: nothing to mark)
                self.mark("lr-change", label=msg.message or "lr re-imposed", step=msg.step)
            elif isinstance(msg, p.Hello) and msg.config.vocab_size:
                self.set_loss_baseline(msg.config.vocab_size)
        elif isinstance(rec, p.CheckpointState) and rec.state == "verified":
            self.mark("checkpoint", label=rec.path.rstrip("/").rsplit("/", 1)[-1], step=rec.step)

    def mark(self, kind: MarkKind, label: str = "", step: int | None = None, x: float | None = None) -> None:
        """A mark at `x` (default: the latest point). A restart mark without x waits for the first
        point of the new attempt, where its curve begins (a resume may go back in tokens)."""
        if kind == "restart":
            # The gap across a restart is not a step time.
            self._last_t = self._last_step = None
            if x is None:
                self._pending.append(Mark(kind=kind, x=0.0, step=step, label=label))
                return
        if x is None:
            if self._last_x is None:
                self._pending.append(Mark(kind=kind, x=0.0, step=step, label=label))
                return
            x = self._last_x
        self._add_mark(Mark(kind=kind, x=x, step=step, label=label))

    # ------------------------------------------------------------------ outputs

    def snapshot(self) -> SeriesSnapshot:
        idx = [i for i in range(self.used) if self._pts[i]]
        cols = []
        for m in range(len(METRICS)):
            lo, hi, sm, cnt, bad = self._lo[m], self._hi[m], self._sum[m], self._cnt[m], self._bad[m]
            col = Column(
                lo=[lo[i] if cnt[i] else None for i in idx],
                hi=[hi[i] if cnt[i] else None for i in idx],
                mean=[sm[i] / cnt[i] if cnt[i] else None for i in idx],
                n=[cnt[i] for i in idx],
            )
            if any(bad[i] for i in idx):
                col.nonfinite = [bad[i] for i in idx]
            cols.append(col)
        return SeriesSnapshot(
            x_unit=self.x_unit or "tokens",
            x0=self.x0 or 0.0,
            width=self.width,
            index=idx,
            x_lo=[self._xlo[i] for i in idx],
            x_hi=[self._xhi[i] for i in idx],
            points=[self._pts[i] for i in idx],
            loss=cols[0],
            lr=cols[1],
            grad_norm=cols[2],
            step_time=cols[3],
            marks=[msgspec.structs.replace(m) for m in self.marks],
            loss_baseline=self.loss_baseline,
            total_points=self.total_points,
            max_buckets=self.max_buckets,
            vitals=list(self.vitals.samples),
        )

    def to_builtins(self) -> dict[str, object]:
        out = msgspec.to_builtins(self.snapshot())
        assert isinstance(out, dict)
        return out

    @classmethod
    def from_snapshot(cls, snap: SeriesSnapshot, max_marks: int = 500) -> Series:
        s = cls(max_buckets=snap.max_buckets, max_marks=max_marks)
        s.x_unit = "steps" if snap.x_unit == "steps" else "tokens"
        s.x0 = snap.x0 if snap.index else None
        s.width = snap.width
        s.total_points = snap.total_points
        s.loss_baseline = snap.loss_baseline
        cols = (snap.loss, snap.lr, snap.grad_norm, snap.step_time)
        for k, i in enumerate(snap.index):
            if not 0 <= i < s.max_buckets:
                continue
            s._xlo[i], s._xhi[i], s._pts[i] = snap.x_lo[k], snap.x_hi[k], snap.points[k]
            s.used = max(s.used, i + 1)
            for m, col in enumerate(cols):
                n = col.n[k] if k < len(col.n) else 0
                if n:
                    lo, hi = col.lo[k], col.hi[k]
                    s._lo[m][i] = lo if lo is not None else math.inf
                    s._hi[m][i] = hi if hi is not None else -math.inf
                    s._sum[m][i] = (col.mean[k] or 0.0) * n
                    s._cnt[m][i] = n
                if col.nonfinite and k < len(col.nonfinite):
                    s._bad[m][i] = col.nonfinite[k]
        s.marks = [msgspec.structs.replace(m) for m in snap.marks]
        s.vitals = VitalsHistory(snap.vitals)
        if snap.index:
            s._last_x = snap.x_hi[-1]
        return s

    def state(self) -> SeriesState:
        u = self.used
        return SeriesState(
            max_buckets=self.max_buckets,
            max_marks=self.max_marks,
            x_unit=self.x_unit,
            x0=self.x0,
            width=self.width,
            used=u,
            total_points=self.total_points,
            loss_baseline=self.loss_baseline,
            marks=[msgspec.structs.replace(m) for m in self.marks],
            pending=[msgspec.structs.replace(m) for m in self._pending],
            xlo=self._xlo[:u],
            xhi=self._xhi[:u],
            pts=self._pts[:u],
            lo=[a[:u] for a in self._lo],
            hi=[a[:u] for a in self._hi],
            sums=[a[:u] for a in self._sum],
            cnt=[a[:u] for a in self._cnt],
            bad=[a[:u] for a in self._bad],
            last_x=self._last_x,
            last_step=self._last_step,
            last_t=self._last_t,
            tok_step=self._tok_step,
            tok_rate=self._tok_rate,
            lr=self._lr,
            lr_flat=self._lr_flat,
            scale=self._scale,
            vitals=list(self.vitals.samples),
        )

    @classmethod
    def from_state(cls, st: SeriesState) -> Series:
        """The Series `state()` was taken of; ValueError when the state does not hold together."""
        s = cls(max_buckets=st.max_buckets, max_marks=st.max_marks)
        u = st.used
        lengths = [len(st.xlo), len(st.xhi), len(st.pts)]
        lengths += [len(a) for g in (st.lo, st.hi, st.sums) for a in g]
        lengths += [len(a) for h in (st.cnt, st.bad) for a in h]
        n_metrics = len(METRICS)
        if not 0 <= u <= s.max_buckets or any(n != u for n in lengths) or len(st.lo) != n_metrics:
            raise ValueError("series state: bucket arrays do not match `used`")
        if not all(len(a) == n_metrics for a in (st.hi, st.sums, st.cnt, st.bad)):
            raise ValueError("series state: one array per metric expected")
        s.x_unit = "steps" if st.x_unit == "steps" else "tokens" if st.x_unit == "tokens" else None
        s.x0, s.width, s.used, s.total_points = st.x0, st.width, u, st.total_points
        s.loss_baseline = st.loss_baseline
        s.marks = [msgspec.structs.replace(m) for m in st.marks]
        s._pending = [msgspec.structs.replace(m) for m in st.pending]
        s._xlo[:u], s._xhi[:u], s._pts[:u] = st.xlo, st.xhi, st.pts
        for m in range(n_metrics):
            s._lo[m][:u], s._hi[m][:u], s._sum[m][:u] = st.lo[m], st.hi[m], st.sums[m]
            s._cnt[m][:u], s._bad[m][:u] = st.cnt[m], st.bad[m]
        s._last_x, s._last_step, s._last_t = st.last_x, st.last_step, st.last_t
        s._tok_step, s._tok_rate = st.tok_step, st.tok_rate
        s._lr, s._lr_flat, s._scale = st.lr, st.lr_flat, st.scale
        s.vitals = VitalsHistory(st.vitals)
        return s

    # ------------------------------------------------------------------ internals

    def _x_of(self, step: int, tokens: int | None) -> float:
        if self.x_unit is None:
            self.x_unit = "tokens" if tokens is not None else "steps"
        if self.x_unit == "steps":
            return float(step)
        if tokens is not None:
            prev = self._tok_step
            if prev is not None and step > prev[0] and tokens >= prev[1]:
                self._tok_rate = (tokens - prev[1]) / (step - prev[0])
            self._tok_step = (step, float(tokens))
            return float(tokens)
        # No tokens on this point: place it by the recent tokens-per-step rate.
        if self._tok_step is None:
            return self._last_x or 0.0
        s0, x0 = self._tok_step
        return x0 + (step - s0) * (self._tok_rate or 0.0)

    def _bucket(self, x: float) -> int:
        x0 = self.x0
        if x0 is None:
            self.x0 = x
            return 0
        if self.width <= 0:
            if x <= x0:
                return 0
            self.width = x - x0  # one step per bucket to begin with; merging doubles it
        i = int((x - x0) // self.width)
        if i < 0:
            return 0  # before the first point ever seen: fold into the first bucket
        while i >= self.max_buckets:
            self._merge()
            i = int((x - x0) // self.width)
        return i

    def _add(self, x: float, values: tuple[float | None, ...]) -> None:
        i = self._bucket(x)
        if i >= self.used:
            self.used = i + 1
        if x < self._xlo[i]:
            self._xlo[i] = x
        if x > self._xhi[i]:
            self._xhi[i] = x
        self._pts[i] += 1
        self.total_points += 1
        self._last_x = x
        isfinite = math.isfinite
        for m, v in enumerate(values):
            if v is None:
                continue
            if not isfinite(v):
                self._bad[m][i] += 1
                continue
            lo = self._lo[m]
            if v < lo[i]:
                lo[i] = v
            hi = self._hi[m]
            if v > hi[i]:
                hi[i] = v
            self._sum[m][i] += v
            self._cnt[m][i] += 1

    def _merge(self) -> None:
        """Pairs of neighbours become one bucket of twice the width."""
        n = self.max_buckets
        half = n // 2

        def fold(a: list[T], op: Callable[[T, T], T], empty: T) -> None:
            for j in range(half):
                a[j] = op(a[2 * j], a[2 * j + 1])
            for j in range(half, n):
                a[j] = empty

        fold(self._xlo, min, math.inf)
        fold(self._xhi, max, -math.inf)
        fold(self._pts, int.__add__, 0)
        for m in range(len(METRICS)):
            fold(self._lo[m], min, math.inf)
            fold(self._hi[m], max, -math.inf)
            fold(self._sum[m], float.__add__, 0.0)
            fold(self._cnt[m], int.__add__, 0)
            fold(self._bad[m], int.__add__, 0)
        self.width *= 2
        self.used = (self.used + 1) // 2
        self._coalesce(self.width)

    def _mark_bucket(self, x: float, width: float) -> int:
        if self.x0 is None or width <= 0:
            return 0
        return max(int((x - self.x0) // width), 0)

    def _add_mark(self, m: Mark) -> None:
        b = self._mark_bucket(m.x, self.width)
        for prev in reversed(self.marks):
            if prev.kind == m.kind:
                if self._mark_bucket(prev.x, self.width) == b:
                    prev.count += m.count
                    return
                break
        self.marks.append(m)
        if len(self.marks) > self.max_marks:
            width = self.width or 1.0
            while len(self.marks) > self.max_marks and width < 2.0**80:
                width *= 2
                self._coalesce(width)

    def _coalesce(self, width: float) -> None:
        """Fold marks of one kind that share a bucket of `width` into the first of them."""
        out: list[Mark] = []
        last: dict[str, Mark] = {}
        for m in self.marks:
            prev = last.get(m.kind)
            if prev is not None and self._mark_bucket(prev.x, width) == self._mark_bucket(m.x, width):
                prev.count += m.count
                continue
            out.append(m)
            last[m.kind] = m
        self.marks = out
