"""The job screen: its typed view of core's merged job view, and the app drawn from it in theme
colours with a key strip (nodes read from real run states folded from records)."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.color import Color

from tests.support.tui_fakes import (
    T0,
    build_state,
    dead_run_records,
    healthy_records,
    in_loop,
    screen_text,
    shipped_themes,
    until,
)
from trainroom.core.configuration.settings import JobOptions, LaunchOptions
from trainroom.core.job.view import NodeReading, job_dict
from trainroom.core.remote.link import Reachability
from trainroom.core.run.state import RunState
from trainroom.tui.job import JobHeader, JobRoom, NodesPanel
from trainroom.tui.jobview import job_screen_view

NOW = T0 + 215


def _node(rank: int, st: RunState, **kw: Any) -> NodeReading:
    st.options = LaunchOptions(job=JobOptions(name="gpt-xl", source="--job", host=f"h{rank}", node_rank=rank))
    return NodeReading(target=f"n{rank}", host=f"h{rank}", run=st.run_id, state=st, **kw)


def _readings() -> list[NodeReading]:
    return [
        _node(0, build_state(healthy_records(), run_id="n0"), keeper="alive"),
        _node(1, build_state(dead_run_records(), run_id="n1")),
    ]


def test_the_view_names_the_dead_node_as_the_jobs_state_and_first_failure() -> None:
    v = job_screen_view(job_dict(None, _readings(), NOW))
    assert (v.head.job, v.head.state, v.head.level, v.head.nodes) == ("gpt-xl", "dead", "crit", 2)
    assert v.head.first_failure is not None and "(h1)" in v.head.first_failure
    assert [(n.node, n.state, n.level, n.host) for n in v.nodes] == [
        ("0", "running", "ok", "h0"),
        ("1", "dead", "crit", "h1"),
    ]
    assert v.head.step_worst == min(int(r.step) for r in v.ranks)
    assert any(n.label == "CRIT DEAD" and n.text.startswith("node 1 (h1): ") for n in v.notes)


def test_a_node_whose_link_is_down_is_unreachable_at_warn_never_dead() -> None:
    down = _node(1, build_state(healthy_records(), run_id="n1"), reach=Reachability(since=NOW - 30, tries=2))
    v = job_screen_view(job_dict("gpt-xl", [_readings()[0], down], NOW))
    assert v.head.state == "unreachable" and v.head.level == "warn"
    (row,) = [n for n in v.nodes if n.node == "1"]
    assert (row.state, row.level, row.reachable) == ("unreachable", "warn", False)
    assert row.link.startswith("unreachable since")


@in_loop
async def test_the_job_screen_draws_in_theme_colours_with_a_key_strip() -> None:
    readings = _readings()
    app = JobRoom("gpt-xl", lambda: readings, clock=lambda: NOW, theme_dirs=shipped_themes())
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.view is not None, "the first view")
        await pilot.pause()
        text = screen_text(app)
        assert "job gpt-xl" in text and " DEAD " in text and "first failure:" in text
        assert "VRAM used" in text and "CRIT DEAD" in text
        assert "q quit" in text.splitlines()[-1] and "t theme" in text.splitlines()[-1]
        # The state colour is the theme's, and follows it when the theme changes.
        for theme in ("trainroom-dark", "trainroom-light"):
            assert app.theme == theme
            crit = Color.parse(app.get_css_variables()["trainroom-crit"]).rich_color
            assert app.query_one(NodesPanel).style("crit").color == crit
            assert app.query_one(JobHeader).style("crit").color == crit
            await pilot.press("t")
            await pilot.pause()
        ids = {b.id: b.tooltip for b in JobRoom.BINDINGS if isinstance(b, Binding)}
        assert set(ids) == {"trainroom.job.quit", "trainroom.job.theme"} and all(ids.values())
        await pilot.press("q")
    assert app.return_code in (0, None)
