"""The job benchmark: the job screen and `trainroom job` attached to K keepers (half local, half
through ssh on loopback: a real sshd started here, as the tests do) × R ranks at S steps/s each.

    python scripts/bench_job.py [--keepers 4] [--ranks 4] [--rate 50] [--seconds 30] [--trials 5]

Each keeper runs bench_tui's publisher (R real reporters, one process). Measured:
- CPU (share of one core) of each keeper, of each remote bridge, and of the job screen
  (`trainroom job TARGETS --tui` in a real tmux pane, 160x48), sampled every 5 s after a warm-up;
- `trainroom job --json` wall time over all K nodes (the one-shot path: one ssh round trip per
  remote node, all nodes at once);
- kill → verdict: a remote node's publisher SIGKILLed, and the time until the job view, followed
  live (core/job/nodes.NodeFollower over ssh, as the job screen does), says the job is dead.
Goals: a remote death visible in <= 1 s, the control room <= 15 % of a core.
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
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.sshd: the sshd the tests start, reused here

from tests.support.sshd import remote_command, start_sshd  # noqa: E402

TRAINROOM = [sys.executable, "-m", "trainroom.cli"]


def launch(home: Path, ranks: int, rate: float, seconds: float) -> str:
    env = dict(os.environ, TRAINROOM_HOME=str(home))
    pub = [sys.executable, str(ROOT / "scripts" / "bench_tui.py"), "--publish", "--ranks", str(ranks)]
    pub += ["--rate", str(rate), "--seconds", str(seconds)]
    out = subprocess.run(
        [*TRAINROOM, "launch", "--job", "bench", "--linger", "5", "--", *pub],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def keeper_of(home: Path, run: str) -> psutil.Process:
    from trainroom.core.run import store

    os.environ["TRAINROOM_HOME"] = str(home)
    rec = store.read_record(home / "runs" / run)
    assert rec.keeper_pid is not None
    return psutil.Process(rec.keeper_pid)


def sample(procs: dict[str, psutil.Process], every: float, n: int) -> dict[str, list[float]]:
    for p in procs.values():
        p.cpu_percent(None)
    out: dict[str, list[float]] = {k: [] for k in procs}
    for _ in range(n):
        time.sleep(every)
        for k, p in procs.items():
            try:
                out[k].append(p.cpu_percent(None))
            except psutil.Error:
                pass
    return out


def kill_to_verdict(sshd_target: str, home: Path, ranks: int, rate: float, trials: int) -> list[float]:
    """SIGKILL a remote node's publisher; seconds until the followed job view says dead."""
    from trainroom.core.job.nodes import NodeFollower, node_refs
    from trainroom.core.job.view import job_dict

    delays = []
    for _ in range(trials):
        run = launch(home, ranks, rate, 600)
        lock, dead = threading.Lock(), threading.Event()
        ref = node_refs([f"{sshd_target}/{run}"], hosts={})[0]
        f = NodeFollower(ref, "bench", lock, lambda: None)

        def changed(f: NodeFollower = f, lock: threading.Lock = lock, dead: threading.Event = dead) -> None:
            with lock:
                if job_dict("bench", [f.reading], time.time())["state"] == "dead":
                    dead.set()

        f.on_change = changed
        f.start()
        while f.records == 0:
            time.sleep(0.05)
        time.sleep(1.0)
        from trainroom.core.run import store

        os.environ["TRAINROOM_HOME"] = str(home)
        pid = store.load_state(home / "runs" / run).attempt.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        dead.wait(60)
        delays.append(time.monotonic() - t0)
        f.stop()
    return delays


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keepers", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is needed for the job screen's figures", file=sys.stderr)
        return 2
    gen = start_sshd()
    sshd = next(gen)
    local, remote = (
        Path(tempfile.mkdtemp(prefix="trbl", dir="/tmp")),
        Path(tempfile.mkdtemp(prefix="trbr", dir="/tmp")),
    )
    os.environ.update(TRAINROOM_SSH_COMMAND=sshd.ssh_command, TRAINROOM_REMOTE_COMMAND=remote_command(remote))
    tmux_sock = str(local / "tmux.sock")
    try:
        life = args.warmup + args.seconds + 60
        n_local = args.keepers // 2
        runs = [(local, launch(local, args.ranks, args.rate, life)) for _ in range(n_local)]
        runs += [(remote, launch(remote, args.ranks, args.rate, life)) for _ in range(args.keepers - n_local)]
        targets = [r if home == local else sshd.target(r) for home, r in runs]
        env = dict(os.environ, TRAINROOM_HOME=str(local))
        t0 = time.monotonic()
        out = subprocess.run([*TRAINROOM, "job", *targets, "--json"], env=env, capture_output=True, text=True)
        one_shot = time.monotonic() - t0
        d = json.loads(out.stdout)
        cmd = " ".join([f"TRAINROOM_HOME={local}", *TRAINROOM, "job", *targets, "--tui"])
        subprocess.run(
            ["tmux", "-S", tmux_sock, "new-session", "-d", "-x", "160", "-y", "48", cmd], check=True, env=env
        )
        pane = int(
            subprocess.run(
                ["tmux", "-S", tmux_sock, "list-panes", "-F", "#{pane_pid}"], capture_output=True, text=True
            ).stdout.split()[0]
        )
        time.sleep(args.warmup)
        screen = next(
            p
            for p in [psutil.Process(pane), *psutil.Process(pane).children(recursive=True)]
            if "--tui" in p.cmdline()
        )
        procs = {
            f"keeper {i} ({'local' if h == local else 'ssh'})": keeper_of(h, r)
            for i, (h, r) in enumerate(runs)
        }
        procs["job screen"] = screen
        bridges = [
            p
            for p in psutil.process_iter(["cmdline", "environ"])
            if "bridge" in (p.info["cmdline"] or [])
            and (p.info["environ"] or {}).get("TRAINROOM_HOME") == str(remote)
        ]
        for i, b in enumerate(bridges):
            procs[f"bridge {i}"] = b
        cpu = sample(procs, 5.0, max(1, int(args.seconds / 5)))
        subprocess.run(["tmux", "-S", tmux_sock, "kill-server"], capture_output=True)
        delays = kill_to_verdict(sshd.target(), remote, args.ranks, args.rate, args.trials)
    finally:
        from trainroom.core.run import store

        for home in (local, remote):
            os.environ["TRAINROOM_HOME"] = str(home)
            for info in store.list_runs():
                store.stop_run(info.run_dir)
        subprocess.run(["tmux", "-S", tmux_sock, "kill-server"], capture_output=True)
        try:
            next(gen)
        except StopIteration:
            pass
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(remote, ignore_errors=True)
    print(
        f"{args.keepers} keepers ({n_local} local, {args.keepers - n_local} over ssh) x {args.ranks} ranks at {args.rate:g} steps/s; load {os.getloadavg()[0]:.1f}"
    )
    print(f"`trainroom job --json` over {len(d['nodes'])} nodes: {one_shot:.2f} s, state {d['state']}")
    print("| process | CPU mean % | max % |\n|---|---:|---:|")
    for k, v in cpu.items():
        if v:
            print(f"| {k} | {statistics.mean(v):.1f} | {max(v):.1f} |")
    print(
        f"kill -9 on a remote node → job dead (followed over ssh): n={len(delays)} p50 {statistics.median(delays):.3f} s, max {max(delays):.3f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
