"""What gating promotion by the trainer's own evaluation costs the trainer: the demo trainer under a
real keeper, flat out (no step delay), saving every --ckpt-every steps, once without an evaluation
and once with the demo's own (`python -m trainroom.core.demo.evaluate {ckpt}`, at nice 19), in
alternating pairs. Reported: the trainer's steps/s over its whole run (first step to last, from the
journal) with and without, their ratio, and how long each evaluation took.

    python scripts/bench_eval.py [--steps 600] [--ckpt-every 50] [--pairs 2]

The trainer runs on one thread (the demo sets it); on a machine with a core to spare the evaluation
takes that core and the ratio is ~1. Where trainer and evaluation share the only free core, nice 19
is what keeps the trainer's share.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _run(steps: int, every: int, with_eval: bool) -> tuple[float, list[float]]:
    from tests.support.helpers import start_demo, status
    from trainroom.core.demo.launcher import demo_eval_command
    from trainroom.core.journal.file import read_journal
    from trainroom.core.run import store as runs
    from trainroom.core.wire import protocol as p

    extra = {"eval_command": demo_eval_command()} if with_eval else {}
    info = start_demo(steps=steps, ckpt_every=every, step_delay=0.0, linger_s=600, extra=extra)
    deadline = time.monotonic() + 900
    want = steps // every
    while time.monotonic() < deadline:
        d = status(info)
        done = [c for c in d["checkpoints"] if c["state"] in ("verified", "held", "rejected")]
        if d["state"] in ("exited", "dead") and len(done) >= want:
            break
        time.sleep(0.5)
    steps_t = []
    evals: list[float] = []
    for rec in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME):
        if isinstance(rec, p.Received) and isinstance(rec.msg, p.Step):
            steps_t.append((rec.msg.step, rec.msg.t))
        elif isinstance(rec, p.CheckpointState) and rec.eval is not None:
            evals.append(rec.eval.seconds)
    runs.stop_run(info.run_dir)
    steps_t.sort()
    (s0, t0), (s1, t1) = steps_t[0], steps_t[-1]
    return (s1 - s0) / (t1 - t0), evals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    home = tempfile.mkdtemp(prefix="trainroom-bench-eval-")
    os.environ["TRAINROOM_HOME"] = home
    without: list[float] = []
    with_: list[float] = []
    evals: list[float] = []
    try:
        for _ in range(args.pairs):
            rate, _e = _run(args.steps, args.ckpt_every, with_eval=False)
            without.append(rate)
            rate, e = _run(args.steps, args.ckpt_every, with_eval=True)
            with_.append(rate)
            evals += e
    finally:
        shutil.rmtree(home, ignore_errors=True)
    a, b = statistics.median(without), statistics.median(with_)
    print(
        f"cpus {os.cpu_count()}  steps {args.steps}  checkpoint every {args.ckpt_every}  pairs {args.pairs}"
    )
    print(f"trainer steps/s without evaluation  {a:8.1f}   ({', '.join(f'{x:.1f}' for x in without)})")
    print(f"trainer steps/s with evaluation     {b:8.1f}   ({', '.join(f'{x:.1f}' for x in with_)})")
    print(f"ratio with/without                  {b / a:8.3f}")
    if evals:
        print(f"evaluations {len(evals)}, median {statistics.median(evals):.2f} s each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
