"""How fast a client sees the truth after a fault, against a real keeper and a real trainer.

  kill -9    -> state `dead`     (the keeper waits on its child: no polling interval to wait out)
  stall      -> state `stalled`  (alive, heartbeats flowing, no step: bound max(3 x median, floor))
  SIGSTOP    -> state `hung`     (process state T, seen by the next probe cycle)
  hang-lock  -> state `hung`     (main thread parked on a lock, heartbeats on: at the stall bound)

The fault time is the kill or SIGSTOP itself, or, for the two that show only by a missing step,
the last step before it.

Each as seconds after the fault and as a multiple of the median step interval; p50/p99 over
the trials. The trainer is a light instrumented loop (no torch) stepping every --interval s.

    python scripts/bench_detect.py [--trials 30] [--interval 0.05] [--stall-trials 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

TRAINER = """
import os, sys, threading, time
from trainroom.core import sdk
rep = sdk.connect(lr=1e-3)
interval = float(sys.argv[1]); stall_at = int(sys.argv[2]); lock_at = int(sys.argv[3])
step = 0
while True:
    time.sleep(interval)
    if stall_at and step >= stall_at:
        continue  # alive, heartbeats flowing, no step: scenario 2's loop
    step += 1
    rep.step(step, loss=2.0, tokens=step * 512)
    if lock_at and step == lock_at:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # the main thread parks for good; the heartbeat thread beats on
"""

FAULT_STEP = 40
VERDICT = {"kill": "dead", "stall": "stalled", "hang": "hung", "hang-lock": "hung"}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def trial(kind: str, interval: float, script: Path) -> tuple[float, float]:
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import KeeperClient
    from trainroom.core.run.launch import launch
    from trainroom.core.wire import protocol

    stall_at = FAULT_STEP if kind == "stall" else 0
    lock_at = FAULT_STEP if kind == "hang-lock" else 0
    info = launch([sys.executable, str(script), str(interval), str(stall_at), str(lock_at)], {"linger_s": 2})
    c = KeeperClient(info.sock)
    st = c.subscribe(client="bench")
    target = VERDICT[kind]
    fault_t: float | None = None
    try:
        for batch in c.records(timeout_s=120):
            for r in batch:
                st.apply(r)
                if isinstance(r, protocol.RunStatus) and r.state == target and fault_t is not None:
                    seen = time.time() - fault_t
                    return seen, st.step_interval() or interval
            a = st.attempt
            if fault_t is None and a is not None and (st.current_step() or 0) >= 30:
                if kind == "kill":
                    fault_t = time.time()
                    os.kill(a.pid, signal.SIGKILL)
                elif kind == "hang":
                    fault_t = time.time()
                    os.kill(a.pid, signal.SIGSTOP)
            if kind in ("stall", "hang-lock") and fault_t is None and (st.current_step() or 0) >= FAULT_STEP:
                fault_t = st.last_step_t() or time.time()
        raise RuntimeError("no verdict")
    finally:
        c.close()
        runs.stop_run(info.run_dir)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--stall-trials", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.05)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="trd", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    script = Path(home) / "trainer.py"
    script.write_text(TRAINER)
    # The bound each verdict is held to (SCENARIOS.md rows 1-3): dead within 1 s of the kill; the
    # others within max(3 x median step, 10 s) of the fault.
    stall_bound = max(3 * args.interval, 10.0)
    bounds = {"kill": 1.0, "stall": stall_bound, "hang": stall_bound, "hang-lock": stall_bound}
    print(
        f"{'fault':10} {'verdict':9} {'n':>3} {'p50 s':>8} {'p99 s':>8} {'max s':>8} {'p50 x step':>11} "
        f"{'p99 x step':>11} {'bound s':>8}"
    )
    try:
        for kind, n in (
            ("kill", args.trials),
            ("stall", args.stall_trials),
            ("hang", args.stall_trials),
            ("hang-lock", args.stall_trials),
        ):
            if n <= 0:
                continue
            secs, mult = [], []
            for _ in range(n):
                s, step = trial(kind, args.interval, script)
                secs.append(s)
                mult.append(s / step)
            print(
                f"{kind:10} {VERDICT[kind]:9} {n:3d} {statistics.median(secs):8.3f} {_pct(secs, 0.99):8.3f} "
                f"{max(secs):8.3f} {statistics.median(mult):11.1f} {_pct(mult, 0.99):11.1f} "
                f"{bounds[kind]:8.1f}",
                flush=True,
            )
    finally:
        time.sleep(2.5)  # each keeper lingers 2 s after its trainer, then exits by itself
        shutil.rmtree(home, ignore_errors=True)
    print(f"step interval {args.interval} s (median measured per trial); {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
