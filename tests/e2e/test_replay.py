"""The batch behind a spike, replayed, end to end: the demo trainer under a real keeper names each
step's batch; `--fault spike` poisons one batch (random labels); the keeper journals the window of
batches when LOSS_SPIKE opens; `trainroom replay` starts the trainer's own command again from the
checkpoint before the step with that batch, and the spike reproduces to the bit. A step that was no
spike says so, and a step outside every recorded window is one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.demo.launcher import demo_dir
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol as p

TORCH_START_S = 240  # a loaded 2-core machine: torch in the trainer, the verifier and the replay


def test_a_poisoned_batch_spike_reproduces_from_the_checkpoint_before_it(trhome: Path) -> None:
    info = start_demo(fault="spike", fault_step=30, steps=60, ckpt_every=10, step_delay=0.0, linger_s=600)

    def done() -> dict[str, Any] | None:
        d = status(info)
        verified = [c for c in d["checkpoints"] if c["state"] == "verified"]
        return d if d["state"] == "exited" and len(verified) == 6 else None

    d = wait_for(done, timeout=TORCH_START_S, what="the run ended with its 6 checkpoints verified")
    spike = next(f for f in d["findings"] if f["code"] == "LOSS_SPIKE")
    assert spike["evidence"]["step"] == 31
    logs = [r for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.BatchLog)]
    assert len(logs) == 1 and logs[0].code == "LOSS_SPIKE"
    row = next(r for r in logs[0].rows if r.step == 31)
    assert row.batch == p.BatchRef(seed=0, index=31)

    out = run_cli("replay", info.run_id, "--step", "31", "--json", timeout=TORCH_START_S)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout)
    assert res["reproduces"] and res["checkpoint_step"] == 30 and res["steps_between"] == 0
    assert res["replayed"] == res["recorded"] == row.loss  # one thread, the same weights and batch
    assert res["replayed"] > res["baseline"] + res["band"]
    assert "reproduces from the checkpoint before it" in res["verdict"]

    # Step 25: the checkpoint at 20, steps 21-24 trained again on their own batches, then 25's.
    out = run_cli("replay", info.run_id, "--step", "25", timeout=TORCH_START_S)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "replayed step 25 (batch index 25, seed 0) from step 20's checkpoint"
    assert lines[1].startswith("step 25 was no spike, so nothing reproduces: replayed ")
    recorded_25 = next(r.loss for r in logs[0].rows if r.step == 25)
    assert f"recorded {recorded_25:.4f}" in lines[1] and f"replayed {recorded_25:.4f}" in lines[1]

    out = run_cli("replay", info.run_id, "--step", "59", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"trainroom: error: no batch recorded for step 59; recorded: steps {logs[0].rows[0].step}-"
        f"{logs[0].rows[-1].step} (LOSS_SPIKE)"
    ]


def test_a_spike_replays_beside_the_run_that_still_trains(trhome: Path) -> None:
    """The run trains on (no end); the replay runs beside it, isolated, and reproduces to the bit."""
    info = start_demo(fault="spike", fault_step=30, steps=None, ckpt_every=10, step_delay=0.05, linger_s=600)

    def ready() -> dict[str, Any] | None:
        d = status(info)
        verified = {c["step"] for c in d["checkpoints"] if c["state"] == "verified"}
        st = runs.load_state(info.run_dir)  # what replay reads: the journal
        journaled = any(r.step == 31 for lg in st.batch_logs for r in lg.rows)
        return d if 30 in verified and journaled and d["ended_s_ago"] is None else None

    d = wait_for(
        ready, timeout=TORCH_START_S, what="step 31's spike journaled and step 30 verified, still training"
    )
    out = run_cli("replay", info.run_id, "--step", "31", "--json", timeout=TORCH_START_S)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout)
    assert res["beside_live_run"] and res["writes_isolated"] and res["reproduces"], res
    assert res["checkpoint_step"] == 30 and res["replayed"] == res["recorded"]
    assert res["covered"] == [os.path.realpath(demo_dir())], res  # the run's cwd, overlaid
    after = status(info)
    assert after["ended_s_ago"] is None and after["step"] > d["step"], after["state"]  # it trained on
