"""The Lightning adapter answers the keeper's "checkpoint now" under DDP: a real Lightning run
(`strategy="ddp"`, two CPU ranks, Lightning's own launcher) under a real keeper; the request is
written as `trainroom launch` writes it on the job's warning signal. Both ranks agree and save
together (a collective: a rank that saved alone would hang the other), rank 0 writes the
candidate, the keeper verifies and promotes it, and training goes on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run import store
from trainroom.core.run.launch import launch
from trainroom.core.sdk.requests import write_request

LIGHTNING = Path(__file__).resolve().parents[1] / "support" / "trainers_ddp" / "lightning_ddp.py"
START_S = 240  # two ranks importing torch and Lightning on a loaded 2-core machine


def test_lightning_ddp_saves_through_the_trainer_when_the_keeper_asks(trhome: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    out = tmp_path / "out"
    argv = [
        sys.executable,
        str(LIGHTNING),
        "--out",
        str(out),
        "--devices",
        "2",
        "--adapter",
        "--step-delay",
        "0.1",
    ]
    info = launch(argv, LaunchOptions(linger_s=120), cwd=str(tmp_path))
    try:

        def training() -> dict[str, Any] | None:
            d = status(info)
            up = all((out / f"rank{r}.up").exists() for r in (0, 1))
            return d if up and [r["rank"] for r in d["ranks"]] == [0, 1] and (d["step"] or 0) >= 3 else None

        wait_for(training, START_S, 0.5, "both Lightning ranks training under the keeper")
        write_request(info.run_dir, "USR2-1")  # what `launch` writes when the job's signal comes

        def verified() -> Any:
            v = store.load_view(info.run_dir).state.last_verified()
            return v if v is not None else None

        v = wait_for(verified, START_S, 0.5, "the candidate Lightning saved, verified by the keeper")
        assert v.step is not None and v.path.endswith(f"step-{v.step:06d}.ckpt"), v
        assert "/.quarantine/" in v.path  # written where the SDK writes candidates, then promoted
        # Both ranks went on past the save (neither waits in a collective the other skipped).
        wait_for(
            lambda: all(
                (r["step"] or 0) >= v.step + 5  # type: ignore[operator]
                for r in status(info)["ranks"]
            ),
            START_S,
            0.5,
            "both ranks stepping on after the save",
        )
        st = store.load_view(info.run_dir).state
        assert [c.step for c in st.checkpoints if c.state == "verified"] == [v.step]  # saved once
        assert st.attempt is not None and st.attempt.alive and st.attempt.n == 1
    finally:
        run_cli("kill", info.run_id, "--yes", timeout=120)
