"""The Slurm job view at cluster scale: `trainroom job slurm:JOBID --json`'s refresh over N nodes
× R ranks, with stand-in `scontrol` and `srun` answering for N nodes (no cluster of that size
here): the stand-in srun prints what N real `trainroom bridge --all --lines` tasks print (a hello
and a snapshot per node, each node's run holding R ranks and 200 steps), so what is measured is
trainroom's own side of a refresh: the Slurm queries it makes, decoding N snapshots, merging the
job, and its CPU.

    python scripts/bench_slurm_job.py [--nodes 8 32 128] [--ranks 8] [--refreshes 20]

Measured per refresh (one a second, the control room's pace; the clock is simulated):
- wall time of slurm_job_dict (stand-in srun: ~2 ms `cat`; a real srun adds its step creation,
  ~0.1-0.5 s, once per refresh whatever N);
- CPU of this process and its children;
- Slurm calls: scontrol (job, node) and srun steps, counted by the stand-ins themselves.
What a user would otherwise run: `watch -n1 squeue -j JOBID` (1 slurmctld RPC a second, no rank).
"""

from __future__ import annotations

import argparse
import base64
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import msgspec  # noqa: E402

from tests.support.synthetic import run_records  # noqa: E402
from trainroom.core.configuration.settings import JobOptions, LaunchOptions  # noqa: E402
from trainroom.core.remote.wire import BridgeHello  # noqa: E402
from trainroom.core.run.state import RunState  # noqa: E402
from trainroom.core.wire import protocol as p  # noqa: E402

JOB = "4242"


def node_state(node: str, rank: int, ranks: int) -> RunState:
    st = RunState(run_id=f"run-{rank}", argv=["python", "train.py"], cwd="/w", created=0.0)
    for rec in run_records(200, ranks, attempts=1, seed=rank):
        st.apply(rec)
    st.options = LaunchOptions(
        job=JobOptions(name=f"slurm-{JOB}", source="SLURM_JOB_ID", host=node, node_rank=rank, nnodes="1")
    )
    return st


def stand_ins(d: Path, nodes: list[str], ranks: int) -> None:
    bindir = d / "bin"
    bindir.mkdir()
    lines = []
    for i, node in enumerate(nodes):
        st = node_state(node, i, ranks)
        hello = BridgeHello(host=node, run_id=f"run-{i}", keeper="alive", job=f"slurm-{JOB}", node_rank=i)
        snap = p.Snapshot(v=p.PROTOCOL_VERSION, state=msgspec.to_builtins(st))
        lines += [f"{i}: TRB {base64.b64encode(p.frame(m)[p.HEADER.size :]).decode()}" for m in (hello, snap)]
    (d / "all.txt").write_text("\n".join(lines) + "\n")
    hostlist = f"b[001-{len(nodes):03d}]"
    job_line = (
        f"JobId={JOB} JobName=train UserId=me(1000) JobState=RUNNING Reason=None Requeue=1 Restarts=0 "
        f"ExitCode=0:0 DerivedExitCode=0:0 RunTime=01:00:00 TimeLimit=04:00:00 NodeList={hostlist} "
        f"BatchHost=b001 NumNodes={len(nodes)} Command=/home/me/job.sh WorkDir=/home/me"
    )
    (d / "job.txt").write_text(job_line + "\n")
    (d / "nodes.txt").write_text("".join(f"NodeName={n} State=ALLOCATED Reason=\n" for n in nodes))
    calls = d / "calls.log"
    (bindir / "scontrol").write_text(
        f'#!/bin/sh\necho "scontrol $2" >> {calls}\n'
        f'case "$2" in job) cat {d / "job.txt"};; node) cat {d / "nodes.txt"};; esac\n'
    )
    (bindir / "srun").write_text(f"#!/bin/sh\necho srun >> {calls}\ncat {d / 'all.txt'}\n")
    for f in bindir.iterdir():
        f.chmod(0o755)


def bench(n: int, ranks: int, refreshes: int) -> dict[str, float]:
    from trainroom.core.cli.slurmjob import slurm_job_dict
    from trainroom.core.slurm.scontrol import SlurmReader

    with tempfile.TemporaryDirectory(prefix="trbench") as tmp:
        d = Path(tmp)
        nodes = [f"b{i:03d}" for i in range(1, n + 1)]
        stand_ins(d, nodes, ranks)
        os.environ["PATH"] = f"{d / 'bin'}{os.pathsep}{os.environ['PATH']}"
        os.environ["TRAINROOM_HOME"] = str(d / "home")
        clock = [0.0]
        reader = SlurmReader(clock=lambda: clock[0])
        walls, cpus = [], []
        for _ in range(refreshes):
            c0 = time.process_time() + _children_cpu()
            t0 = time.perf_counter()
            out = slurm_job_dict(JOB, reader)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() + _children_cpu() - c0)
            clock[0] += 1.0
            assert len(out["nodes"]) == n and len(out["ranks"]) == n * ranks, (
                len(out["nodes"]),
                len(out["ranks"]),
            )
        said = (d / "calls.log").read_text().splitlines()
        os.environ["PATH"] = os.environ["PATH"].split(os.pathsep, 1)[1]
    return {
        "nodes": n,
        "ranks": n * ranks,
        "refresh_ms_median": statistics.median(walls) * 1000,
        "refresh_ms_max": max(walls) * 1000,
        "cpu_ms_median": statistics.median(cpus) * 1000,
        "scontrol_per_refresh": sum(1 for s in said if s.startswith("scontrol")) / refreshes,
        "srun_per_refresh": sum(1 for s in said if s == "srun") / refreshes,
    }


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--refreshes", type=int, default=20)
    args = ap.parse_args()
    print("nodes  ranks  refresh ms (median / max)  CPU ms  scontrol/refresh  srun steps/refresh")
    for n in args.nodes:
        r = bench(n, args.ranks, args.refreshes)
        print(
            f"{r['nodes']:5d}  {r['ranks']:5d}  {r['refresh_ms_median']:8.0f} / {r['refresh_ms_max']:6.0f}"
            f"  {r['cpu_ms_median']:14.0f}  {r['scontrol_per_refresh']:16.2f}  {r['srun_per_refresh']:18.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
