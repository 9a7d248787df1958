"""Per-step cost of `reporter.step` (8 values) against what a user would otherwise write:
TensorBoard's `SummaryWriter.add_scalar` x 8 and a `print` to a file, in one process, median and
p99, with a real keeper reading and with that keeper stopped (SIGSTOP): the reporter must never
block the training loop.

    python scripts/bench_reporter.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    """Median, p99 and mean in µs: the mean counts the sends a window of steps shares."""
    s = sorted(samples)
    return statistics.median(s) * 1e6, s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6, statistics.fmean(s) * 1e6


def bench(fn, steps: int) -> tuple[float, float, float, float]:
    """Median, p99 and mean wall µs a call, and the process's CPU µs a call over the whole loop
    (what a loaded machine's preemptions do not inflate; the heartbeat thread's share included)."""
    for i in range(200):
        fn(i)
    out = []
    clock = time.perf_counter
    cpu0 = time.process_time()
    for i in range(steps):
        t0 = clock()
        fn(i)
        out.append(clock() - t0)
    cpu = (time.process_time() - cpu0) / steps * 1e6
    return (*_percentiles(out), cpu)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    args = ap.parse_args()
    if "TRAINROOM_RUN" not in os.environ:
        return outer(args.steps)
    return inner(args.steps)


def outer(steps: int) -> int:
    """Run this script as a keeper's trainer (the keeper takes a reporter only from a process of
    its run) and print what it printed."""
    home = tempfile.mkdtemp(prefix="trb", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    from trainroom.core.configuration.settings import LaunchOptions
    from trainroom.core.run import store as runs
    from trainroom.core.run.launch import launch

    info = launch(
        [sys.executable, os.path.abspath(__file__), "--steps", str(steps)], LaunchOptions(linger_s=5)
    )
    log = Path(info.run_dir) / "trainer.log"
    keeper = runs.read_record(Path(info.run_dir)).keeper_pid
    while keeper and _alive(keeper) and "cores" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.5)
    print(log.read_text(), end="")
    runs.stop_run(info.run_dir)
    return 0


def inner(steps: int) -> int:
    home = tempfile.mkdtemp(prefix="trb", dir="/tmp")
    from trainroom.core.sdk import reporter as reporter
    from trainroom.core.wire import protocol

    keeper_pid = os.getppid()  # the keeper started this attempt
    rep = reporter.Reporter(os.environ["TRAINROOM_SOCKET"], protocol.Hello(pid=os.getpid()), heartbeat_s=1.0)

    def rstep(i: int) -> None:
        rep.step(
            i,
            loss=2.5,
            tokens=i * 512,
            grad_norm=0.9,
            lr=1e-4,
            loss_scale=65536.0,
            alloc=(1 << 30, 2 << 30, 3 << 30),
        )

    results: list[tuple[str, float, float, float, float]] = []
    results.append(("reporter.step, keeper reading", *bench(rstep, steps)))
    os.kill(keeper_pid, signal.SIGSTOP)
    try:
        results.append(("reporter.step, keeper SIGSTOPped", *bench(rstep, steps)))
        dropped = rep.dropped
    finally:
        os.kill(keeper_pid, signal.SIGCONT)

    from torch.utils.tensorboard import SummaryWriter

    tb = SummaryWriter(log_dir=os.path.join(home, "tb"))
    names = ["loss", "tokens", "grad_norm", "lr", "loss_scale", "allocated", "reserved", "peak"]

    def tstep(i: int) -> None:
        for n in names:
            tb.add_scalar(n, 1.0, i)

    results.append(("SummaryWriter.add_scalar x 8", *bench(tstep, steps)))
    tb.close()
    with open(os.path.join(home, "log.txt"), "w") as f:

        def pstep(i: int) -> None:
            print(f"step {i} loss 2.5 tokens {i * 512} gn 0.9 lr 1e-4 ls 65536 a 1 r 2 p 3", file=f)

        results.append(("print to a file", *bench(pstep, steps)))
    rep.close()

    base = results[0][1]
    print(
        f"{'what':36} {'median us':>10} {'p99 us':>10} {'mean us':>10} {'CPU us':>10} {'median vs reporter':>20}"
    )
    for name, med, p99, mean, cpu in results:
        print(f"{name:36} {med:10.2f} {p99:10.2f} {mean:10.2f} {cpu:10.2f} {med / base:19.1f}x")
    tb_med = results[2][1]
    print(
        f"\nTensorBoard / reporter (keeper reading): {tb_med / base:.1f}x; "
        f"p99 with the keeper stopped: {results[1][2]:.1f} us; frames dropped while stopped: {dropped}"
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
