"""The control room's long actions and stack dumps against a real keeper, through Pilot:

- a kill whose wait for the GPU memory is long (the driver, through the fake NVML at the pynvml
  boundary, goes on listing the killed process's context) counts down in the strip over the
  keys, the key strip offers X first, and X ends the wait: the result says cancelled, in words;
- `d` on a real 2-rank torchrun run dumps the workers (the processes carrying RANK), each
  rank's stacks in a block of its own labelled by rank, never the launcher's.

Every wait is a bound on something the keeper or the screen reports; nothing asserts how fast.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import status
from tests.support.tui_fakes import in_loop, screen_text
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.probes.fake_nvml import ENV as FAKE_NVML
from trainroom.core.probes.fake_nvml import write_scenario
from trainroom.core.run.launch import launch
from trainroom.tui.app import ControlRoom
from trainroom.tui.screens.confirm import ConfirmAction
from trainroom.tui.screens.result import ActionResult

pytestmark = pytest.mark.e2e

GIB = 1 << 30
START_S = 120.0
TORCHRUN_START_S = 180.0  # two ranks importing torch on a loaded 2-core machine
DDP_TRAINER = Path(__file__).resolve().parents[1] / "support" / "trainers_ddp" / "train_ddp.py"

# A trainer that leaves a child holding a GPU context (in a session of its own): once the
# trainer is gone, the child is what ORPHAN_CONTEXT's kill targets.
LEAVES_A_STRAGGLER = """
    import subprocess, sys, time
    from trainroom.core import sdk
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    with open(sys.argv[1], "w") as f:
        f.write(str(child.pid))
    rep = sdk.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, alloc=(1 << 30, 1 << 30, 1 << 30))
        time.sleep(0.05)
"""


async def _until(
    pilot: Any, cond: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str]
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{detail()}")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


_LEFT = re.compile(r"^kill running \d+ s, (\d+) s left · X: cancel the wait · ")


@in_loop
async def test_a_kill_waiting_for_vram_counts_down_and_x_cancels_the_wait(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = tmp_path / "gpu.json"
    write_scenario(gpu, {"devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": 0}]})
    monkeypatch.setenv(FAKE_NVML, str(gpu))
    script, pid_file = tmp_path / "t.py", tmp_path / "child"
    script.write_text(textwrap.dedent(LEAVES_A_STRAGGLER))
    info = launch(
        [sys.executable, str(script), str(pid_file)], LaunchOptions(linger_s=120), cwd=str(tmp_path)
    )
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, what="the child"))
    try:
        d = wait_for(lambda: (s := status(info))["step"] and s, timeout=START_S, what="steps")
        os.kill(d["attempts"][-1]["pid"], signal.SIGKILL)
        wait_for(lambda: status(info)["state"] == "dead", timeout=60, what="dead")
        # The driver lists the child's context, and goes on listing it after its process ends.
        write_scenario(
            gpu,
            {
                "devices": [{"name": "NVIDIA H200", "total_bytes": 141 * GIB, "used_bytes": GIB}],
                "processes": [{"pid": child, "used_bytes": GIB}],
            },
        )
        f = wait_for(lambda: _finding(status(info), "ORPHAN_CONTEXT"), timeout=60, what="ORPHAN_CONTEXT")
        app = ControlRoom(info.run_id)
        async with app.run_test(size=(160, 48)) as pilot:
            shown = lambda: screen_text(app)  # noqa: E731
            await _until(
                pilot,
                lambda: app.connected and app.why_not("kill", f["ident"]) is None,
                START_S,
                "the finding's kill to apply",
                shown,
            )
            await pilot.press("ctrl+k")
            confirm = await _until(
                pilot,
                lambda: isinstance(app.screen, ConfirmAction) and app.screen,
                60,
                "the confirmation",
                shown,
            )
            # What happens to what, in one line: the child, named by the finding; the trainer alone.
            assert confirm.headline.startswith("kills "), confirm.headline
            assert f"what {f['ident']} names; the trainer is left alone" in confirm.headline
            assert f"pid {child}" in "\n".join(confirm.lines)
            await pilot.press("y")
            strip = app.query_one("#action-strip")

            def left() -> int | None:
                m = _LEFT.search(strip.view or "")
                return int(m.group(1)) if m else None

            first = await _until(pilot, left, 60, "the countdown in the strip", shown)
            # What runs, how long is left, the key, then the keeper's words without the countdown.
            assert "· waiting for the driver to release VRAM: 1.0 GiB held" in (strip.view or "")
            assert (strip.view or "").count("s left") == 1, strip.view
            assert _gone(child)
            # It counts down between the keeper's lines, and the key strip offers X first.
            await _until(
                pilot, lambda: (n := left()) is not None and n < first, 30, "the countdown to move", shown
            )
            app.redraw()
            await pilot.pause()
            assert screen_text(app).splitlines()[-1].startswith(" X cancel kill "), shown()
            await pilot.press("X")
            result = await _until(
                pilot, lambda: isinstance(app.screen, ActionResult) and app.screen, 60, "the result", shown
            )
            text = await _until(
                pilot, lambda: "kill: cancelled" in shown() and shown(), 10, "its words", shown
            )
            assert result.title_text == "kill: cancelled"
            assert result.outcome.message.startswith("cancelled the wait for VRAM after"), (
                result.outcome.message
            )
            assert "but the driver still holds 1.0 GiB for the run (release not confirmed)" in (
                result.outcome.message
            )
            assert "cancelled the wait for VRAM after" in text
            await pilot.press("escape")
            await _until(
                pilot, lambda: app.flow.running is None and not strip.display, 10, "the strip gone", shown
            )
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


@in_loop
async def test_d_on_a_torchrun_run_dumps_each_worker_labelled_by_rank(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)  # else torchrun itself would look like a rank
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(DDP_TRAINER),
        "--step-delay",
        "0.1",
        "--sdk",
    ]
    info = launch(argv, LaunchOptions(linger_s=120), cwd=str(tmp_path))

    def two_ranks() -> dict[str, Any] | None:
        d = status(info)
        rows = d["ranks"]
        ok = [r["rank"] for r in rows] == [0, 1] and all(r["pid"] and r["connected"] for r in rows)
        return d if ok and (d["step"] or 0) >= 2 else None

    d = wait_for(two_ranks, timeout=TORCHRUN_START_S, what="two connected ranks, stepping")
    pids = {r["rank"]: r["pid"] for r in d["ranks"]}
    launcher = d["pid"]
    assert launcher not in pids.values()
    app = ControlRoom(info.run_id)
    async with app.run_test(size=(160, 48)) as pilot:
        shown = lambda: screen_text(app)  # noqa: E731
        await _until(
            pilot, lambda: app.connected and app.why_not("dump") is None, START_S, "dump to apply", shown
        )
        await pilot.press("d")
        result = await _until(
            pilot,
            lambda: isinstance(app.screen, ActionResult) and app.screen,
            120,
            "the dump's result",
            shown,
        )
        o = result.outcome
        assert o.ok, o.message
        ranks = o.after["ranks"]
        assert {r["rank"]: r["pid"] for r in ranks} == pids, ranks  # the workers, not torchrun
        for r in ranks:
            assert r["method"] == "faulthandler" and "train_ddp.py" in r["stacks"], r
        assert o.message.startswith("stacks of 2 of 2 ranks, read by faulthandler"), o.message
        # Each rank's stacks under its own heading, the box's width for them, no table.
        assert [h for h, _ in result.blocks] == [
            f"rank {r['rank']} (pid {r['pid']}), read by faulthandler" for r in ranks
        ]
        await pilot.pause()
        text = shown()
        assert "dump: done" in text and "before → after" not in text
        assert f"rank {ranks[0]['rank']} (pid {ranks[0]['pid']}), read by faulthandler" in text
        assert "train_ddp.py" in text
        assert str(launcher) not in "\n".join(h for h, _ in result.blocks)
        await pilot.press("escape")
        await _until(pilot, lambda: not isinstance(app.screen, ActionResult), 10, "the result closed", shown)

        # One rank stopped: HUNG names it and offers continue; a dump says it is stopped and
        # reads it where it stopped, the stopped rank first.
        os.kill(pids[1], signal.SIGSTOP)
        try:
            await _until(pilot, lambda: "[U] continue" in shown(), 60, "HUNG offering continue", shown)
            await _until(pilot, lambda: app.why_not("dump") is None, 30, "dump to apply", shown)
            await pilot.press("d")
            result = await _until(
                pilot, lambda: isinstance(app.screen, ActionResult) and app.screen, 120, "the dump", shown
            )
            ranks = result.outcome.after["ranks"]
            assert [r["pid"] for r in ranks] == [pids[1], pids[0]], ranks
            stopped = ranks[0]
            assert stopped["stopped"] and not ranks[1]["stopped"]
            assert stopped["message"].startswith(f"pid {pids[1]} is stopped (SIGSTOP)"), stopped
            assert "continue (U) lets it run on" in stopped["message"]
            assert f"rank 1: pid {pids[1]} is stopped (SIGSTOP)" in result.outcome.message
            if stopped["stacks"]:  # py-spy may read it (ptrace rights): where it stopped
                assert stopped["method"] == "py-spy" and "train_ddp.py" in stopped["stacks"]
            assert ranks[1]["method"] == "faulthandler" and "train_ddp.py" in ranks[1]["stacks"]
        finally:
            os.kill(pids[1], signal.SIGCONT)
