"""After the kill of a GHOST_MEMORY finding's target, the kill's result and the zoomed VRAM panel
say one truth. The driver is the fake NVML (the one stand-in), read by the real GPU probe; the
kill is the real `execute_kill` of a process of this test's own (a `sleep` marked with the
test's run id), with the real VRAM wait over the same driver. The probe sample the control room
holds was taken before the kill, as the keeper's last one is when the result arrives."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import msgspec
import psutil

from tests.support.tui_fakes import GiB, MiB, healthy_records, in_loop, make_app, screen_text, settle
from trainroom.core.ops.kill import execute_kill, plan_kill
from trainroom.core.ops.vram import run_vram_probe
from trainroom.core.probes.fake_nvml import FakeNvml, write_scenario
from trainroom.core.probes.gpu import GpuProbe
from trainroom.core.run.figures import vram
from trainroom.core.run.status import status_dict
from trainroom.core.wire import protocol as p
from trainroom.tui.widgets.vram import VramPanel

RUN = "test-vram-after-kill"
DEVICE = {
    "name": "NVIDIA GeForce RTX 3060 (fake)",
    "total_bytes": 12 * GiB,
    "util_percent": 85,
    "power_w": 160.0,
}


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"], process_group=0, env=dict(os.environ, TRAINROOM_RUN=RUN))


@in_loop
async def test_the_zoomed_vram_list_drops_what_the_kill_found_released_and_the_words_agree(
    tmp_path: Path,
) -> None:
    trainer, ghost = _sleeper(), _sleeper()
    try:
        scenario = tmp_path / "nvml.json"
        own, held = 4 * GiB + 300 * MiB, 4 * GiB + 100 * MiB
        write_scenario(
            scenario,
            {
                "devices": [DEVICE | {"used_bytes": own + held}],
                "processes": [
                    {"pid": trainer.pid, "used_bytes": own},
                    {"pid": ghost.pid, "used_bytes": held},
                ],
            },
        )
        gpu = GpuProbe(FakeNvml(scenario))
        before = gpu.sample(our_pids={trainer.pid, ghost.pid})
        assert {x.pid for x in before.processes} == {trainer.pid, ghost.pid}

        def driver_releases() -> None:  # what the driver does once the ghost is gone
            deadline = time.monotonic() + 30
            while psutil.pid_exists(ghost.pid) and ghost.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            write_scenario(
                scenario,
                {
                    "devices": [DEVICE | {"used_bytes": own}],
                    "processes": [{"pid": trainer.pid, "used_bytes": own}],
                },
            )

        releases = threading.Thread(target=driver_releases, daemon=True)
        releases.start()
        plan = plan_kill(ghost.pid, ghost.pid, psutil.Process(ghost.pid).create_time(), run_id=RUN)
        probe = run_vram_probe(gpu, [ghost.pid], of=f"pid {ghost.pid}")  # a finding's target: its pid
        result = execute_kill(plan, grace_s=5, vram_probe=probe, vram_timeout_s=30, vram_poll_s=0.05)
        releases.join(timeout=30)
        assert result.ok and result.vram_released, result.message
        # The words: the ghost is no longer listed; not "no process of the run" (the trainer is).
        assert f"the driver lists pid {ghost.pid} no more" in result.message
        assert "no process of the run" not in result.message

        recs = healthy_records(steps=10, t0=before.t - 20)
        recs.append(p.ProbeSample(t=before.t, gpu=before))
        recs.append(
            p.ActionRecord(
                action="kill",
                t=time.time(),
                ok=result.ok,
                message=result.message,
                before=result.before,
                after=result.after,
            )
        )
        app, _, _ = make_app(str(tmp_path), recs, now=time.time())
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(app, pilot)
            panel = app.query_one(VramPanel)
            await pilot.press("3", "z")
            await pilot.pause()
            assert app.screen.maximized is panel
            lines = screen_text(app).splitlines()
            st = app.state
        table = [line.strip("│ ") for line in lines if re.match(r"│\s+\d+\s+[\d.]+ [GM]iB  ", line)]
        assert [line.split()[0] for line in table] == [str(trainer.pid)], table
        assert "4.3 GiB" in table[0] and "this run" in table[0]
        # Every figure from the same view: the run's and the device's 4.3 GiB, in `status` too.
        v = vram(st)
        assert v.run_bytes == own and v.used_bytes == own
        d = status_dict(st)
        assert d["gpu"]["devices"][0]["used_bytes"] == own
    finally:
        for child in (trainer, ghost):
            if child.poll() is None:
                child.kill()
            child.wait()


def test_a_kill_that_did_not_release_marks_its_processes_gone_not_this_run() -> None:
    # The driver still holds the memory after the kill: the rows stay, said gone (their
    # processes are), never "this run" as the older sample had them; a sample newer than the
    # kill is the driver's own word and stands as it is.
    from tests.support.tui_fakes import T0, build_state
    from trainroom.core.run.figures import driver_view
    from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample
    from trainroom.tui.figures import gpu_process_rows

    sample = GpuSample(
        t=T0 + 10,
        available=True,
        per_process=True,
        devices=[GpuDevice(index=0, name="fake", used_bytes=8 * GiB, total_bytes=12 * GiB)],
        processes=[
            GpuProcess(pid=4242, used_bytes=4 * GiB, exists=True, ours=True),
            GpuProcess(pid=4300, used_bytes=4 * GiB, exists=True, ours=True),
        ],
    )
    after = {"members": 0, "pids": [], "vram_bytes": 4 * GiB, "vram_basis": "per-process"}
    kill = p.ActionRecord(
        action="kill", t=T0 + 20, ok=False, message="…", before={"pids": [4300]}, after=after
    )
    st = build_state([*healthy_records(steps=3), p.ProbeSample(t=T0 + 10, gpu=sample), kill])
    rows = {r.pid: r.who for r in gpu_process_rows(st)}
    assert rows == {4242: "this run · rank 0", 4300: "gone: memory left behind"}
    newer = msgspec.structs.replace(sample, t=T0 + 30)
    st.apply(p.ProbeSample(t=T0 + 30, gpu=newer))  # a newer probe: the driver's word again
    assert driver_view(st) == newer
