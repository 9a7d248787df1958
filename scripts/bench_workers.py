"""What watching torchrun's workers costs each probe cycle, and how fast their faults are told.

Part 1, the probe cycle (a launcher with --ranks rank processes, each in a session of its own
with a DataLoader-like child, as torch elastic starts them), per call:
  - the group view alone (what the probe read before: it cannot see the workers),
  - the group view and the workers from one /proc walk (the keeper's cycle, environments cached),
  - the same on a first cycle (every environment read),
  - what a user would otherwise write: psutil's children(recursive=True) and environ() of each.

Part 2 (--trials N > 0), a real `torchrun --nproc_per_node=2` (gloo, CPU) of the test trainer
under a keeper, uninstrumented: seconds from SIGSTOP of rank 1's worker to `hung` naming rank 1,
and from SIGKILL of it to `dead` headlined "rank 1 killed by SIGKILL", as a client sees them.

    python scripts/bench_workers.py [--ranks 8] [--cycles 300] [--trials 5]
    python scripts/bench_workers.py --cycles-off --trials 5 --lightning   # Lightning DDP's launcher
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAUNCHER = """
import json, os, subprocess, sys, time
out, n = sys.argv[1], int(sys.argv[2])
code = ("import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)")
pids = []
for r in range(n):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n))
    pids.append(subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True).pid)
open(out, "w").write(json.dumps(pids))
time.sleep(600)
"""


def _time(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def cycle_costs(ranks: int, cycles: int) -> None:
    import psutil

    from trainroom.core.probes.procs import group_states, scan
    from trainroom.core.probes.workers import WorkerFinder, rank_env

    d = Path(tempfile.mkdtemp(prefix="trbw"))
    out = d / "pids.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(out), str(ranks)], env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = json.loads(out.read_text())
        time.sleep(2.0)  # every rank's child started
        pgid = launcher.pid
        finder = WorkerFinder()
        assert len(finder.find(scan(), launcher.pid)) == ranks

        def keeper_cycle() -> None:
            table = scan()
            group_states(pgid, table=table)
            finder.find(table, launcher.pid)

        def cold_cycle() -> None:
            table = scan()
            group_states(pgid, table=table)
            WorkerFinder().find(table, launcher.pid)

        def psutil_way() -> None:
            found = []
            for c in psutil.Process(launcher.pid).children(recursive=True):
                try:
                    e = c.environ()
                except psutil.Error:
                    continue
                if "RANK" in e:
                    found.append((c.pid, c.status(), e["RANK"]))

        ways: list[tuple[str, Callable[[], Any]]] = [
            ("group view only (before: no workers)", lambda: group_states(pgid)),
            ("group + workers, one walk (the keeper's cycle)", keeper_cycle),
            ("group + workers, first cycle (environments read)", cold_cycle),
            ("psutil children(recursive) + environ() each", psutil_way),
        ]
        times: list[list[float]] = [[] for _ in ways]
        for _ in range(cycles):  # round-robin: a loaded machine's noise falls on every row alike
            for i, (_name, fn) in enumerate(ways):
                times[i] += _time(fn, 1)
        rows = [(name, xs) for (name, _fn), xs in zip(ways, times, strict=True)]
        base = statistics.median(rows[1][1])
        nproc = len(scan())
        print(
            f"\nprobe cycle, {ranks} ranks (+{ranks} children), {nproc} processes on the host, {cycles} calls\n"
        )
        print("| what | median ms | p95 ms | vs the keeper's cycle |")
        print("|---|---:|---:|---:|")
        for name, xs in rows:
            med = statistics.median(xs)
            p95 = sorted(xs)[int(0.95 * (len(xs) - 1))]
            print(f"| {name} | {med:.2f} | {p95:.2f} | {med / base:.2f}x |")
        assert all(rank_env(pid) is not None for pid in workers)
    finally:
        for pid in json.loads(out.read_text()) if out.exists() and out.read_text() else []:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        shutil.rmtree(d, ignore_errors=True)


def detection(trials: int, lightning: bool = False) -> None:
    home = tempfile.mkdtemp(prefix="trbw", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    from tests.support.helpers import status
    from tests.support.waiting import kill_runs_under, wait_for
    from trainroom.core.configuration.settings import LaunchOptions
    from trainroom.core.run.launch import launch

    trainer = ROOT / "tests" / "support" / "trainers_ddp" / "train_ddp.py"
    light = ROOT / "tests" / "support" / "trainers_ddp" / "lightning_ddp.py"
    stop_s: list[float] = []
    kill_s: list[float] = []
    try:
        for _ in range(trials):
            cwd = tempfile.mkdtemp(prefix="trbwc", dir="/tmp")
            if lightning:  # Lightning's own launcher: rank 1 a re-run of the script, rank 0's child
                argv = [sys.executable, str(light), "--out", f"{cwd}/out", "--devices", "2"]
            else:
                argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
                argv += [str(trainer), "--step-delay", "0.05"]
            info = launch(argv, LaunchOptions(linger_s=30), cwd=cwd)
            # Lightning's Rich bar draws nothing to a file before the end: its ranks' marks say
            # they train.
            up = [Path(cwd) / "out" / f"rank{r}.up" for r in (0, 1)]
            d = wait_for(
                lambda info=info, up=up: (
                    (x := status(info))
                    and len([r for r in x["ranks"] if r["pid"]]) == 2
                    and (all(p.exists() for p in up) if lightning else (x["step"] or 0) > 5)
                    and x
                ),
                timeout=600,
            )
            pid1 = next(r["pid"] for r in d["ranks"] if r["rank"] == 1)
            t0 = time.time()
            os.kill(pid1, signal.SIGSTOP)
            wait_for(
                lambda info=info: (x := status(info))["state"] == "hung" and "rank 1" in x["state_reason"],
                timeout=60,
                interval=0.01,
            )
            stop_s.append(time.time() - t0)
            os.kill(pid1, signal.SIGCONT)
            if lightning:
                # Its bar draws nothing to a file: no step says it runs again; the verdict moves on.
                try:
                    wait_for(lambda info=info: status(info)["state"] != "hung", timeout=20)
                except AssertionError:
                    pass
            else:
                wait_for(lambda info=info: status(info)["state"] == "running", timeout=60)
            t0 = time.time()
            os.kill(pid1, signal.SIGKILL)
            wait_for(
                lambda info=info: (
                    (x := status(info))["state"] == "dead"
                    and x["state_reason"].startswith("rank 1 killed by SIGKILL")
                ),
                timeout=60,
                interval=0.01,
            )
            kill_s.append(time.time() - t0)
            shutil.rmtree(cwd, ignore_errors=True)
    finally:
        kill_runs_under(Path(home))
        shutil.rmtree(home, ignore_errors=True)
    what = "Lightning DDP (--devices 2)" if lightning else "torchrun --nproc_per_node=2"
    print(f"\n{what}, uninstrumented, {trials} trials: fault -> verdict at a client\n")
    print("kill s:", " ".join(f"{x:.2f}" for x in kill_s), " stop s:", " ".join(f"{x:.2f}" for x in stop_s))
    print("| fault | verdict | p50 s | max s |")
    print("|---|---|---:|---:|")
    print(
        f"| SIGSTOP rank 1's worker | hung, naming rank 1 | {statistics.median(stop_s):.2f} | {max(stop_s):.2f} |"
    )
    print(
        f'| SIGKILL rank 1\'s worker | dead, "rank 1 killed by SIGKILL" | {statistics.median(kill_s):.2f} | '
        f"{max(kill_s):.2f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--lightning", action="store_true", help="part 2 with Lightning DDP's own launcher")
    ap.add_argument("--cycles-off", action="store_true", help="skip part 1")
    args = ap.parse_args()
    if not args.cycles_off:
        cycle_costs(args.ranks, args.cycles)
    if args.trials > 0:
        detection(args.trials, args.lightning)
    return 0


if __name__ == "__main__":
    sys.exit(main())
