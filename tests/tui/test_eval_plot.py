"""The trainer's own evaluation of each promoted checkpoint on the loss plot: a `•` at its
checkpoint's x and its figure's y, kept inside the plotted range, in the legend; a held checkpoint
(its evaluation regressed) has no dot, as it has no checkpoint mark."""

from __future__ import annotations

from tests.support.tui_fakes import T0, build_state, healthy_records
from trainroom.core.wire import protocol as p
from trainroom.tui.figures import loss_view
from trainroom.tui.plot import chart


def _ckpt(step: int, state: str, figure: float) -> p.CheckpointState:
    return p.CheckpointState(
        path=f"/ck/step-{step:06d}.pt",
        step=step,
        state=state,  # type: ignore[arg-type]
        t=T0 + step,
        eval=p.EvalFigure(figure=figure, passed=state == "verified"),
    )


def test_each_promoted_checkpoint_has_its_evaluation_on_the_plot() -> None:
    st = build_state([*healthy_records(steps=40), _ckpt(10, "verified", 3.5), _ckpt(20, "held", 9.0)])
    view = loss_view(st)
    assert len(view.evals) == 1
    x, y = view.evals[0]
    assert y == 3.5 and x in {m.x for m in view.marks if m.kind == "checkpoint"}


def test_a_dot_is_drawn_where_its_figure_is_and_stretches_the_range_to_show_it() -> None:
    points = [(float(x), 2.0 - x / 100) for x in range(100)]
    c = chart(points, cols=40, rows=8, dots=[(50.0, 4.0)])
    assert c.y_max >= 4.0  # the evaluation above the curve stays on the plot
    cells = [(r, k) for r, row in enumerate(c.rows) for k, cell in enumerate(row) if cell == ("•", "eval")]
    assert cells == [(0, 20)]  # x 50 of 0..99 on 40 columns; the top row
    assert chart(points, cols=40, rows=8).rows == chart(points, cols=40, rows=8, dots=[]).rows
