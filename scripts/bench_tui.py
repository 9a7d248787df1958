"""CPU and memory of the keeper and the control room: a healthy run, and a telemetry flood.

A synthetic trainer (this script, `--publish`) runs under a real keeper (`cli.launch`): by default
a flood of 1000 messages a second (10 ranks, each a real `Reporter` on its own connection, Hello
rank 0..9, 100 steps a second); `--ranks 1 --rate 10` is a healthy 10 steps/s run. The control
room is the real console script, `trainroom watch RUN`, in a real tmux pane. Every 5 s psutil
samples CPU (share of one core) and RSS of the keeper, the control room and the publisher; the
table shows them over time, then the goals:

    keeper <= 10 % of a core; control room <= 3 % on a healthy run (<= 100 msg/s), <= 10 % under
    the flood; RSS flat after the warm-up.

    python scripts/bench_tui.py [--seconds 60] [--ranks 10] [--rate 100] [--size 160x48]
    python scripts/bench_tui.py --ranks 1 --rate 10 --size 80x24
    python scripts/bench_tui.py --ranks 1 --rate 10 --keys H   # idle with the history graphs drawn

The machine's load average and its overall CPU use are printed with each row: on a shared
machine the figures mean little without them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

KEEPER_GOAL = 10.0  # % of one core
TUI_GOAL_HEALTHY = 3.0  # a healthy run: btop and nvitop idle at 1-3 %
TUI_GOAL_FLOOD = 10.0  # 1000 msg/s
HEALTHY_MSG_S = 100.0  # up to this rate a run counts as healthy for the goal
RSS_FLAT_MIB = 8.0  # growth after the warm-up that still counts as flat
RSS_FLAT_SHARE = 0.05


# ---------------------------------------------------------------------------- the publisher


def publish(ranks: int, rate: float, seconds: float) -> int:
    """The trainer side: `ranks` reporters, `rate` steps a second each, paced on a clock."""
    from trainroom.core.sdk.reporter import Reporter
    from trainroom.core.wire import protocol as p

    sock = os.environ["TRAINROOM_SOCKET"]
    config = p.RequestedConfig(lr=3e-4, vocab_size=50257)
    reps = [
        Reporter(sock, p.Hello(pid=os.getpid(), rank=r, world_size=ranks, config=config, argv=sys.argv))
        for r in range(ranks)
    ]
    period = 1.0 / rate
    start = time.monotonic()
    step = sent = 0
    next_print = start + 1.0
    alloc = (5 << 30, 6 << 30, 7 << 30)
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        step += 1
        for r, rep in enumerate(reps):
            loss = 2.0 + 8.0 / (1 + step / 500) + 0.01 * r
            rep.step(step, loss=loss, tokens=step * 8192, grad_norm=1.0, lr=3e-4, alloc=alloc)
        sent += ranks
        if now >= next_print:
            print(f"sent {sent} in {now - start:.1f} s, dropped {sum(r.dropped for r in reps)}", flush=True)
            next_print += 1.0
        # Absolute deadlines: a late tick does not move the ones after it.
        delay = start + step * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    for rep in reps:
        rep.close()
    print(f"sent {sent} in {time.monotonic() - start:.1f} s, done", flush=True)
    return 0


# ---------------------------------------------------------------------------- the bench


def _send_keys(tsock: str, keys: str) -> None:
    """Once the control room shows the run (60 s at most), the keys (space-separated), if any."""
    if not keys:
        return
    shown = time.monotonic() + 60
    while time.monotonic() < shown and "RUNNING" not in _tmux(tsock, "capture-pane", "-p", "-t", "bench"):
        time.sleep(0.5)
    _tmux(tsock, "send-keys", "-t", "bench", *keys.split())


def _tmux(sock: str, *args: str) -> str:
    out = subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    if out.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _find_tui(pane_pid: int) -> psutil.Process:
    """The control room: the pane's process or one under it (the shell may or may not exec)."""
    root = psutil.Process(pane_pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            if "watch" in p.cmdline():
                return p
        except psutil.Error:
            continue
    raise RuntimeError(f"no `trainroom watch` under pane pid {pane_pid}")


def _keeper(run_dir: Path) -> psutil.Process:
    """The keeper writes its pid into the run record once it is up (psutil.Process(None) would
    be this very process)."""
    from trainroom.core.run import store as runs

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rec = runs.read_record(run_dir)
        if rec.keeper_pid is not None and rec.keeper_pid != os.getpid():
            return psutil.Process(rec.keeper_pid)
        time.sleep(0.05)
    raise RuntimeError(f"no keeper pid in {run_dir}")


def _sent(log: Path) -> int | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("sent "):
            return int(line.split()[1])
    return None


def _mib(n: int) -> float:
    return n / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured time (default 60)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before the first counted sample")
    ap.add_argument("--ranks", type=int, default=10)
    ap.add_argument("--rate", type=float, default=100.0, help="steps a second per rank")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--size", default="160x48", help="the tmux pane, COLSxROWS")
    ap.add_argument("--show", action="store_true", help="print the control room's last screen")
    ap.add_argument(
        "--keys",
        default="",
        help="keys sent to the control room once it shows the run, space-separated (H: the history graphs)",
    )
    ap.add_argument("--tui-goal", type=float, default=None, help="%% of a core (default: by the rate)")
    ap.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.publish:
        return publish(args.ranks, args.rate, args.seconds)

    if shutil.which("tmux") is None:
        print("bench_tui: tmux is not installed", file=sys.stderr)
        return 2
    near = Path(sys.executable).with_name("trainroom")
    script = str(near) if near.exists() else shutil.which("trainroom")
    if script is None:
        print("bench_tui: the trainroom console script is not installed (pip install -e .)", file=sys.stderr)
        return 2
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    tui_goal = args.tui_goal
    if tui_goal is None:
        tui_goal = TUI_GOAL_HEALTHY if args.ranks * args.rate <= HEALTHY_MSG_S else TUI_GOAL_FLOOD

    home = tempfile.mkdtemp(prefix="trt", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    from trainroom.core.run import store as runs
    from trainroom.core.run.launch import launch

    total = args.warmup + args.seconds
    publisher = [
        sys.executable,
        os.path.abspath(__file__),
        "--publish",
        "--ranks",
        str(args.ranks),
        "--rate",
        str(args.rate),
        "--seconds",
        str(total + 15),
    ]
    info = launch(publisher, {"linger_s": 30, "ckpt_root": os.path.join(home, "ck")}, cwd=home)
    keeper = _keeper(Path(info.run_dir))
    tsock = os.path.join(home, "tmux.sock")
    trainer: psutil.Process | None = None
    try:
        _tmux(
            tsock,
            "new-session",
            "-d",
            "-s",
            "bench",
            "-x",
            str(cols),
            "-y",
            str(rows),
            "-e",
            f"TRAINROOM_HOME={home}",
            f"{shlex.quote(script)} watch {info.run_id}",
        )
        tui = _find_tui(int(_tmux(tsock, "display-message", "-p", "-t", "bench", "#{pane_pid}").strip()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = runs.load_state(info.run_dir)
            if st.attempt is not None and st.attempt.pid:
                trainer = psutil.Process(st.attempt.pid)
                break
            time.sleep(0.2)
        if trainer is None:
            raise RuntimeError("the publisher never started")
        _send_keys(tsock, args.keys)
        procs = {"keeper": keeper, "tui": tui, "publisher": trainer}
        for p in procs.values():
            p.cpu_percent(None)
        psutil.cpu_percent(None)
        log = Path(info.run_dir) / runs.LOG_NAME

        print(
            f"run {info.run_id}: {args.ranks} ranks x {args.rate:g} steps/s = "
            f"{args.ranks * args.rate:g} msg/s for {args.seconds:g} s (+{args.warmup:g} s warm-up), "
            f"control room in a {cols}x{rows} tmux pane; {psutil.cpu_count()} cores"
        )
        print(
            f"{'t s':>5} {'keeper %':>9} {'keeper MiB':>10} {'tui %':>7} {'tui MiB':>8} {'pub %':>7} "
            f"{'msg/s':>7} {'host %':>7} {'load 1m':>8}"
        )
        rows_out: list[dict[str, float]] = []
        t0 = time.monotonic()
        sent0, tsent0 = _sent(log) or 0, t0
        while time.monotonic() - t0 < total:
            time.sleep(args.every)
            now = time.monotonic()
            sent = _sent(log) or 0
            row = {
                "t": now - t0,
                "msg_s": (sent - sent0) / (now - tsent0),
                "host": psutil.cpu_percent(None),
                "load": os.getloadavg()[0],
            }
            sent0, tsent0 = sent, now
            for name, p in procs.items():
                row[name] = p.cpu_percent(None)
                row[name + "_rss"] = _mib(p.memory_info().rss)
            rows_out.append(row)
            print(
                f"{row['t']:5.0f} {row['keeper']:9.1f} {row['keeper_rss']:10.1f} {row['tui']:7.1f} "
                f"{row['tui_rss']:8.1f} {row['publisher']:7.1f} {row['msg_s']:7.0f} {row['host']:7.0f} "
                f"{row['load']:8.2f}",
                flush=True,
            )
        screen = _tmux(tsock, "capture-pane", "-p", "-t", "bench")
    finally:
        subprocess.run(["tmux", "-S", tsock, "kill-server"], capture_output=True, timeout=30)
        runs.stop_run(info.run_dir)

    # A sample covers the `every` seconds before it: count those that began after the warm-up.
    counted = [r for r in rows_out if r["t"] - args.every >= args.warmup - 0.5]
    if not counted:
        print("bench_tui: no sample after the warm-up", file=sys.stderr)
        return 1
    keeper_cpu = statistics.mean(r["keeper"] for r in counted)
    tui_cpu = statistics.mean(r["tui"] for r in counted)
    rate = statistics.mean(r["msg_s"] for r in counted)
    host = statistics.mean(r["host"] for r in counted)
    print(
        f"\nafter the warm-up ({len(counted)} samples): {rate:.0f} msg/s delivered, machine "
        f"{host:.0f}% busy overall ({psutil.cpu_count()} cores), load {counted[-1]['load']:.2f}"
    )

    def flat(name: str) -> tuple[bool, str]:
        first, last = counted[0][name + "_rss"], counted[-1][name + "_rss"]
        grew = last - first
        ok = grew <= max(RSS_FLAT_MIB, first * RSS_FLAT_SHARE)
        return ok, f"{first:.1f} -> {last:.1f} MiB ({grew:+.1f})"

    checks = [
        (
            f"keeper CPU <= {KEEPER_GOAL:g}% of a core",
            keeper_cpu <= KEEPER_GOAL,
            f"mean {keeper_cpu:.1f}%, max {max(r['keeper'] for r in counted):.1f}%",
        ),
        (
            f"control room CPU <= {tui_goal:g}%",
            tui_cpu <= tui_goal,
            f"mean {tui_cpu:.1f}%, max {max(r['tui'] for r in counted):.1f}%",
        ),
        ("keeper RSS flat", *flat("keeper")),
        ("control room RSS flat", *flat("tui")),
        (
            f"delivered >= 90% of {args.ranks * args.rate:g} msg/s",
            rate >= 0.9 * args.ranks * args.rate,
            f"{rate:.0f} msg/s",
        ),
    ]
    for what, ok, detail in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {what:34} {detail}")
    if args.show:
        print("\n" + screen)
    shutil.rmtree(home, ignore_errors=True)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
