"""The first verdict after a save, as a keeper gives it: the verifier warm from launch against the
cold start it replaces, on an idle machine and on a loaded one. Run by `bench_verify.py
--first-verdict` (which documents the options); kept apart so bench_verify.py stays one page.

Each trial launches a real keeper and an instrumented trainer that connects, waits --save-after
seconds (a run's first steps), then saves one checkpoint through the SDK (announced to the
keeper, verified there). The latency is the keeper's own clock from the Checkpoint frame it
received to the `verified` record it journaled. Cold: nothing at launch says checkpoints are
expected (no --ckpt-root), so the verifier starts at the save. Warm: `--ckpt-root` given, so it
starts with the keeper. Loaded: --busy CPU loops (`while True: pass`) run through the trial.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRAINER = textwrap.dedent(
    """
    import sys, time
    import torch
    from trainroom.core import sdk

    save_after, mb = float(sys.argv[1]), float(sys.argv[2])
    rep = sdk.connect(lr=1e-3)
    t_end = time.monotonic() + save_after
    step = 0
    while time.monotonic() < t_end:
        step += 1
        rep.step(step, loss=2.0)
        time.sleep(0.1)
    n = max(1, int(mb * 1e6 / 4 / 4096))
    g = torch.Generator().manual_seed(0)
    state = {"model": {"transformer.h.0.mlp.c_fc.weight": torch.randn(n, 4096, generator=g) * 0.02}}
    sdk.save_checkpoint(state, step=step)
    print("saved", flush=True)
    time.sleep(600)
    """
)


def _first_verdict_s(run_dir: Path) -> float | None:
    from trainroom.core.journal import file as journal
    from trainroom.core.run import store as runs
    from trainroom.core.wire import protocol as p

    saved = verdict = None
    for r in journal.read_journal(run_dir / runs.JOURNAL_NAME):
        if isinstance(r, p.Received) and isinstance(r.msg, p.Checkpoint) and saved is None:
            saved = r.t
        elif isinstance(r, p.CheckpointState) and r.state in ("verified", "rejected") and verdict is None:
            verdict = r.t
    return None if saved is None or verdict is None else verdict - saved


def trial(home: Path, warm: bool, save_after: float, mb: float, timeout: float) -> float:
    from trainroom.core.run import store as runs

    project = Path(tempfile.mkdtemp(prefix="trfv", dir=home))
    (project / "train.py").write_text(TRAINER)
    cmd = [sys.executable, "-m", "trainroom.cli", "launch"]
    if warm:
        cmd += ["--ckpt-root", str(project / "ck")]
    cmd += ["--", sys.executable, "train.py", str(save_after), str(mb)]
    env = {**os.environ, "TRAINROOM_HOME": str(home)}
    out = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=120, check=True)
    run_id = out.stdout.strip()
    os.environ["TRAINROOM_HOME"] = str(home)
    info = runs.resolve_run(run_id)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            got = _first_verdict_s(Path(info.run_dir))
            if got is not None:
                return got
            time.sleep(0.2)
        raise TimeoutError(f"no verdict within {timeout:.0f} s ({'warm' if warm else 'cold'})")
    finally:
        runs.stop_run(info.run_dir)


def busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def run(trials: int, save_after: float, mb: float, busy: int, timeout: float) -> int:
    home = Path(tempfile.mkdtemp(prefix="trb", dir="/tmp"))  # short: the socket path must fit
    rows: list[tuple[str, str, list[float]]] = []
    try:
        for load, n_busy in (("idle", 0), (f"{busy} busy loops", busy)):
            loops = busy_loops(n_busy)
            try:
                for mode, warm in (("cold start (before)", False), ("warm from launch", True)):
                    got = [trial(home, warm, save_after, mb, timeout) for _ in range(trials)]
                    rows.append((load, mode, got))
                    print(f"  {load:14s} {mode:20s} " + " ".join(f"{x:.2f}" for x in got), flush=True)
            finally:
                for p in loops:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    print(f"\nfirst verdict after a save ({mb:g} MB checkpoint, saved {save_after:g} s after launch), s:")
    print(f"  {'host':14s} {'verifier':20s} {'n':>2s} {'median':>8s} {'max':>8s} {'cold / warm':>12s}")
    medians = {(load, mode): statistics.median(xs) for load, mode, xs in rows}
    for load, mode, xs in rows:
        cold = medians.get((load, "cold start (before)"))
        ratio = f"{cold / medians[(load, mode)]:.1f}x" if cold and mode.startswith("warm") else ""
        print(
            f"  {load:14s} {mode:20s} {len(xs):2d} {statistics.median(xs):8.2f} {max(xs):8.2f} {ratio:>12s}"
        )
    return 0
