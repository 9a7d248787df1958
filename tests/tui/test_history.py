"""The history screen (`H`) and the options (`O`) through Pilot: the graphs of the journal's
samples over 5 min / 1 h / the whole run (`w`), a figure nobody measured said so with its reason
once, the options cycled and kept in control-room.json, the graphs redrawn in the chosen units
and style, the refresh rate applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.tui_fakes import T0, GiB, healthy_records, in_loop, make_app, screen_text, settle, until
from trainroom.core.samples import VitalsSample
from trainroom.core.wire import protocol as p
from trainroom.tui.history import history_lines
from trainroom.tui.screens.history import HistoryScreen
from trainroom.tui.screens.options import OptionsScreen


def vitals(t: float, i: int) -> p.Vitals:
    return p.Vitals(
        v=VitalsSample(
            t=t,
            mem_used_bytes=(8 + i % 4) * GiB,
            mem_total_bytes=31 * GiB,
            page_cache_bytes=6 * GiB,
            cpu_percent=90.0 + i % 10,
            disk_free_bytes=60 * GiB,
            disk_write_bps=float(1 << 20),
        )
    )


def records() -> list[Any]:
    recs = healthy_records(steps=10)
    # Two hours a minute apart, then the last five minutes every 5 s.
    ts = [T0 - 7200 + 60 * i for i in range(115)] + [T0 - 300 + 5 * i for i in range(61)]
    recs += [vitals(t, i) for i, t in enumerate(ts)]
    return recs


def test_the_lines_say_what_is_unmeasured_once_and_draw_the_rest_from_zero() -> None:
    samples = [r.v for r in records() if isinstance(r, p.Vitals)]
    lines = history_lines(
        samples, 2, 80, 40, gpu_note="driver view unavailable: NVML Shared Library Not Found"
    )
    text = "\n".join(line.text for line in lines)
    assert text.count("NVML Shared Library Not Found") == 1  # the GPU's reason, once for its figures
    assert "VRAM (allocator): — (the trainer reports no allocator figures" in text
    assert "host RAM used  11.0 GiB  (min 8.0 GiB, max 11.0 GiB)" in text
    assert "window: all (176 samples over 2h00m)" in text
    assert any(line.text.strip().startswith("0│") for line in lines)  # every graph from 0
    recent = history_lines(samples, 0, 80, 40)
    assert "window: 5 min (61 samples" in recent[0].text
    decimal = history_lines(samples, 0, 80, 40, units="decimal", style="blocks")
    assert "host RAM used  11.8 GB" in "\n".join(line.text for line in decimal)
    assert history_lines([], 0, 80, 24)[0].text.startswith("no samples yet")


@in_loop
async def test_h_draws_the_history_w_zooms_and_the_options_are_kept(tmp_path, private_settings: Path) -> None:
    app, link, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        link.push([r for r in records() if isinstance(r, p.Vitals)])  # live, as the keeper sends them
        await until(
            pilot, lambda: app.series is not None and len(app.series.vitals.samples) == 176, "the samples"
        )
        await pilot.press("H")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen), "the history screen")
        await pilot.pause()
        text = screen_text(app)
        assert "› history · 5 min" in text and "window: 5 min (61 samples" in text
        assert "host RAM used" in text and "run CPU" in text
        await pilot.press("w")
        await until(pilot, lambda: "window: 1 h" in screen_text(app), "the hour")
        await pilot.press("w")
        await until(
            pilot, lambda: "window: all (176 samples over 2h00m)" in screen_text(app), "the whole run"
        )
        await pilot.press("O")
        await until(pilot, lambda: isinstance(app.screen, OptionsScreen), "the options")
        await pilot.press("r", "u", "g", "enter")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen), "back to the history")
        await until(pilot, lambda: "decimal units · blocks" in screen_text(app), "the graphs redrawn")
        assert "GB" in screen_text(app) and app.routine_interval_s == 2.0
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen), "back to the room")
    kept = json.loads((private_settings / "control-room.json").read_text())
    assert kept == {"refresh_s": 2.0, "units": "decimal", "graph": "blocks"}
    # The next session opens with them.
    again, _, _ = make_app(str(tmp_path), healthy_records(steps=10))
    async with again.run_test(size=(80, 24)) as pilot:
        await settle(again, pilot)
        assert again.routine_interval_s == 2.0 and again.room_options.graph == "blocks"
