"""Which rank it was, under real launchers: a worker death torchrun absorbs with
`--max-restarts` is a RANK_RESTARTED event naming the rank; Lightning's DDP on CPU (its own
launcher: the process started is rank 0 and re-runs the script for rank 1 with LOCAL_RANK and no
RANK), uninstrumented with its default Rich bar, names rank 1 when it is stopped and when it is
killed; a Lightning LR warm-up is no LR_MISMATCH; a DEAD with an HF `checkpoint-N/` that nobody
watched says so and how to watch it.

Every process signalled here is one this test started (a rank's pid comes from status and is
checked to be a descendant of this run's leader); the `trhome` fixture tears down the rest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run.launch import launch
from trainroom.core.run.store import RunInfo

SUPPORT = Path(__file__).resolve().parents[1] / "support"
DDP = SUPPORT / "trainers_ddp" / "train_ddp.py"
LIGHTNING = SUPPORT / "trainers_ddp" / "lightning_ddp.py"
START_S = 240  # two ranks importing torch (and Lightning) on a loaded 2-core machine


def _events(info: RunInfo) -> list[dict[str, Any]]:
    out = run_cli("events", info.run_id, "--json")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _ranks_up(info: RunInfo, want: list[int]) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        d = status(info)
        rows = d["ranks"]
        ok = [r["rank"] for r in rows] == want and all(
            r["pid"] and r["state"] in ("running", "sleeping") for r in rows
        )
        return d if ok and (d["step"] or 0) >= 2 else None

    d: dict[str, Any] = wait_for(ready, timeout=START_S, what=f"ranks {want} with pids, stepping")
    return d


def _ours(info: RunInfo, pid: int) -> None:
    """`pid` is a process this run started: the leader or one of its descendants."""
    leader = psutil.Process(status(info)["pid"])
    assert pid == leader.pid or pid in {c.pid for c in leader.children(recursive=True)}


# --------------------------------------------------------------------------- torchrun restarts


def test_a_worker_death_torchrun_restarts_is_an_event_naming_the_rank(trhome: Path, tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        str(DDP),
        "--step-delay",
        "0.1",
    ]
    info = launch(argv, LaunchOptions(linger_s=120), cwd=str(tmp_path))
    d = _ranks_up(info, [0, 1])
    victim = next(r for r in d["ranks"] if r["rank"] == 1)
    _ours(info, victim["pid"])
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        s = status(info)
        return s if _finding(s, "RANK_RESTARTED") is not None else None

    s = wait_for(restarted, timeout=START_S, what="RANK_RESTARTED")
    f = _finding(s, "RANK_RESTARTED")
    assert f is not None
    assert "rank 1 died (killed by SIGKILL) and torchrun restarted the group, restart 1 of 1" in f["message"]
    assert f["evidence"]["rank"] == 1 and f["evidence"]["pid"] == victim["pid"]
    assert s["state"] not in ("dead", "exited")  # the attempt goes on
    # The new group runs: both ranks again, new pids, the attempt the same one.
    d2 = _ranks_up(info, [0, 1])
    assert d2["attempt"] == d["attempt"] and victim["pid"] not in {r["pid"] for r in d2["ranks"]}
    found = [e for e in _events(info) if e["event"] == "finding" and e.get("code") == "RANK_RESTARTED"]
    assert found and "rank 1 died (killed by SIGKILL)" in found[0]["message"]


# --------------------------------------------------------------------------- Lightning DDP


def _lightning(tmp_path: Path, *extra: str) -> RunInfo:
    argv = [sys.executable, str(LIGHTNING), "--out", str(tmp_path / "out"), *extra]
    return launch(argv, LaunchOptions(linger_s=120), cwd=str(tmp_path))


@pytest.mark.parametrize("adapter", [False, True], ids=["uninstrumented", "adapter"])
def test_lightning_ddp_a_stopped_then_killed_rank_1_is_named(
    trhome: Path, tmp_path: Path, adapter: bool
) -> None:
    pytest.importorskip("lightning")
    info = _lightning(tmp_path, "--devices", "2", *(["--adapter"] if adapter else []))

    up = [tmp_path / "out" / f"rank{r}.up" for r in (0, 1)]

    def two() -> dict[str, Any] | None:
        d = status(info)
        rows = d["ranks"]
        ok = [r["rank"] for r in rows] == [0, 1] and all(r["pid"] for r in rows)
        return d if ok and all(p.exists() for p in up) else None

    d = wait_for(two, timeout=START_S, what="Lightning's two ranks with pids, training")
    pids = {r["rank"]: r["pid"] for r in d["ranks"]}
    assert [int(p.read_text()) for p in up] == [pids[0], pids[1]]
    assert pids[0] == d["pid"]  # rank 0 is the process started; rank 1 its re-run of the script
    _ours(info, pids[1])
    rank1 = psutil.Process(pids[1])
    rank1.suspend()
    try:

        def hung() -> dict[str, Any] | None:
            s = status(info)
            return s if s["state"] == "hung" else None

        s = wait_for(hung, timeout=60, what="HUNG naming the stopped rank")
        f = _finding(s, "HUNG")
        assert f is not None and f["evidence"]["rank"] == 1 and f["evidence"]["pid"] == pids[1], f
        assert f"rank 1 (pid {pids[1]}) is stopped" in f["message"]
    finally:
        rank1.resume()
    os.kill(pids[1], signal.SIGKILL)

    def dead() -> dict[str, Any] | None:
        s = status(info)
        return s if s["state"] == "dead" and _finding(s, "DEAD") is not None else None

    s = wait_for(dead, timeout=120, what="DEAD")
    f = _finding(s, "DEAD")
    assert f is not None and f["evidence"]["rank"] == 1, f
    assert f"rank 1 killed by SIGKILL (pid {pids[1]})" in f["message"], f["message"]
    assert "Connection reset" not in f["message"]  # what followed from it, not its cause
    assert f"rank 0 (pid {pids[0]}, the process started)" in f["message"]

    def ended() -> dict[str, Any] | None:
        s = status(info)
        return s if s["exit"]["code"] is not None or s["exit"]["signal"] is not None else None

    # DEAD came at rank 1's death (Lightning restarts no rank); rank 0 ends at its next collective.
    s = wait_for(ended, timeout=120, what="rank 0, the process started, ended")
    f = _finding(s, "DEAD")
    assert f is not None and f"rank 1 killed by SIGKILL (pid {pids[1]})" in f["message"], f
    # Rank 0 is the process the keeper started: its exit is its own wait status, not "gone".
    rank0 = next(r for r in s["ranks"] if r["rank"] == 0)
    assert rank0["exit"] is not None and (rank0["exit"]["code"], rank0["exit"]["signal"]) == (
        s["exit"]["code"],
        s["exit"]["signal"],
    ), (rank0, s["exit"])
    assert s["exit"]["code"] is not None or s["exit"]["signal"] is not None


def test_a_lightning_lr_warmup_is_no_lr_mismatch(trhome: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    # LinearLR from 1e-3 of the LR over 3 epochs of 10 steps, stepped per epoch (Lightning's
    # default interval): the LR sits 1000x low and flat for the first 10 steps.
    info = _lightning(
        tmp_path,
        "--devices",
        "1",
        "--adapter",
        "--max-steps",
        "60",
        "--warmup",
        "3",
        "--interval",
        "epoch",
        "--batches",
        "10",
    )
    d = wait_for(
        lambda: (s := status(info))["state"] in ("exited", "dead") and s, timeout=START_S, what="end"
    )
    assert d["state"] == "exited" and d["step"] == 60, d["state_reason"]
    assert d["lr"]["effective"] == [pytest.approx(3e-3)] and d["lr"]["requested"] == pytest.approx(3e-3)
    codes = {e.get("code") for e in _events(info) if e["event"] == "finding"}
    assert "LR_MISMATCH" not in codes, codes


# --------------------------------------------------------------------------- unwatched checkpoints

HF_LIKE = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    for step in range(1, 451):
        print(f"iter {step}: loss {3.0 - step / 1000:.4f}, time 1.00ms, mfu 0.01%", flush=True)
        if step % 200 == 0:  # what an HF Trainer saves: output_dir/checkpoint-<step>/
            d = os.path.join(out, f"checkpoint-{step}")
            os.makedirs(d)
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(b"x" * 64)
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_dead_with_an_unwatched_hf_checkpoint_says_how_to_watch_it(trhome: Path, tmp_path: Path) -> None:
    info = launch([sys.executable, "-c", HF_LIKE, "out"], LaunchOptions(linger_s=120), cwd=str(tmp_path))
    s = wait_for(
        lambda: (d := status(info))["state"] == "dead" and _finding(d, "DEAD") is not None and d,
        timeout=120,
        what="DEAD",
    )
    f = _finding(s, "DEAD")
    assert f is not None
    msg = f["message"]
    assert "no verified checkpoint" in msg
    assert "out/checkpoint-400/ (and 1 more) in the working directory is not watched" in msg, msg
    assert "--watch-ckpt 'out/checkpoint-*'" in msg and "[checkpoints]" in msg
    assert f["action"] is None  # nothing verified: no resume offered
    assert f["evidence"]["unwatched_checkpoints"] == ["out/checkpoint-400", "out/checkpoint-200"]
