"""How soon the control room shows a live run, against what a user would otherwise start.

A real demo run (`trainroom demo --detach --forever`: the bundled CPU trainer under a real keeper)
trains in a temporary TRAINROOM_HOME. Each case is then typed, in turn, into a fresh window of
one tmux server (its own socket; the server is up before the first case, so its start is no one's
cost), and the wall time from `tmux new-window` to the first capture of the pane that meets the
case's condition is taken (the pane is read every `--poll` seconds):

    trainroom watch RUN   the header shows the run's id, RUNNING and its step
    trainroom             (the newest live run, found by itself) the same
    top                   its summary line ("load average") — a terminal monitor's start
    textual hello         a minimal Textual app drawing one word: the least any Textual app costs

The cases take turns (a round runs each once), so the machine's load falls on all alike; each
line gives the median and the worst wall seconds, and the median over the rounds of each round's
ratio to `top` and to the minimal Textual app, and the CPU (user + sys) the case's process had
used when its pane first met the condition (what a loaded machine stretches the wall time by) and
`--settle` seconds later (the whole start, with what it does just after its first frame). Goal: the control room's first frame with the
run's state within 1 s (1.5 s on a loaded machine).

    python scripts/bench_first_frame.py [--rounds 7] [--size 160x48] [--src OTHER/src] [--before OLD/src]

`--src` measures another checkout's sources the same way; `--before OLD/src` adds the code before
a change as one more case (`before: watch RUN`), taking its turn in each round. Every
process gets its bytecode as an installed package has it (pip compiles at install; a source tree
writes `__pycache__` on first import): written to a cache under the temporary home by an untimed
warm-up round, even where PYTHONDONTWRITEBYTECODE is set (`--no-bytecode` keeps that setting, and
then every start compiles the sources again).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

CONSOLE = "import sys; from trainroom.cli import main; sys.exit(main())"
HELLO = (
    "from textual.app import App\n"
    "from textual.widgets import Static\n"
    "class Hello(App[None]):\n"
    "    def compose(self):\n"
    "        yield Static('hello-frame')\n"
    "Hello().run()\n"
)


def _tmux(sock: str, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        ["tmux", "-S", sock, *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _console(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CONSOLE, *argv], env=env, capture_output=True, text=True, timeout=120
    )


def start_demo(env: dict[str, str]) -> str:
    """A live demo run with steps flowing; its id."""
    out = _console(env, "demo", "--detach", "--forever", "--step-delay", "0.2", "--linger", "0")
    if out.returncode != 0:
        raise SystemExit(f"trainroom demo failed: {out.stderr.strip()[-500:]}")
    run_id = out.stdout.split()[0]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        st = _console(env, "status", run_id)
        if st.returncode == 0 and "RUNNING" in st.stdout and re.search(r"step [1-9]\d", st.stdout):
            return run_id
        time.sleep(0.5)
    raise SystemExit(f"the demo run {run_id} did not report steps within 180 s")


def stop_demo(env: dict[str, str], run_id: str) -> bool:
    """Kill the demo's trainer; its keeper (no linger) ends after it. True once both are gone."""
    out = _console(env, "kill", run_id, "--yes", "--grace", "5")
    if out.returncode != 0:
        print(f"bench_first_frame: could not stop {run_id}: {out.stderr.strip()}", file=sys.stderr)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = _console(env, "status", run_id, "--json")
        if st.returncode == 0 and json.loads(st.stdout)["keeper"] == "gone":
            return True
        time.sleep(0.5)
    print(
        f"bench_first_frame: the keeper of {run_id} is still up; {env['TRAINROOM_HOME']} kept",
        file=sys.stderr,
    )
    return False


def shows_run(run_id: str) -> Callable[[str], bool]:
    def ok(text: str) -> bool:
        head = text.lstrip("\n").partition("\n")[0]
        return run_id in head and "RUNNING" in head and re.search(r"\bstep \d+", head) is not None

    return ok


def one(
    sock: str,
    command: str,
    ready: Callable[[str], bool],
    poll: float,
    limit: float,
    settle: float,
    src: str | None = None,
) -> tuple[float, float, float]:
    """Wall seconds from typing `command` (a new tmux window) to a pane that meets `ready`, the
    CPU seconds (user + sys) its process had used by then, and by `settle` seconds later."""
    t0 = time.monotonic()
    pane, pid = _tmux(
        sock, "new-window", "-P", "-F", "#{pane_id} #{pane_pid}", "-t", "bench", command
    ).split()
    try:
        while True:
            text = _tmux(sock, "capture-pane", "-p", "-t", pane)
            t = time.monotonic() - t0
            if ready(text):
                at = _cpu(int(pid))
                time.sleep(settle)
                return t, at, _cpu(int(pid))
            if t > limit:
                raise SystemExit(f"`{command}` showed nothing ready within {limit:g} s:\n{text}")
            time.sleep(poll)
    finally:
        _tmux(sock, "kill-pane", "-t", pane)
        _wait_gone(int(pid))


def _cpu(pid: int) -> float:
    """User + sys seconds of the pane's process and those under it (tmux may start a shell)."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _wait_gone(pid: int, limit: float = 30.0) -> None:
    """The case's process is gone before the next starts (a dying one still takes a core)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--size", default="160x48", help="the tmux window, COLSxROWS")
    ap.add_argument("--poll", type=float, default=0.01, help="seconds between reads of the pane")
    ap.add_argument(
        "--settle", type=float, default=2.0, help="seconds after the frame to read the CPU again (default 2)"
    )
    ap.add_argument("--src", help="another checkout's src/ to measure instead of this one's")
    ap.add_argument(
        "--before", help="another checkout's src/ (the code before a change): its `watch RUN` takes turns too"
    )
    ap.add_argument(
        "--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE (compile at every start)"
    )
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("bench_first_frame: tmux is not installed", file=sys.stderr)
        return 2
    src = os.path.abspath(args.src or str(Path(__file__).resolve().parents[1] / "src"))
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    home = tempfile.mkdtemp(prefix="bff", dir="/tmp")
    os.chmod(home, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINROOM_")}
    env |= {"PYTHONPATH": src, "TRAINROOM_HOME": home}
    if not args.no_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(home, "pycache")
    sock = os.path.join(home, "tmux.sock")
    run_id = start_demo(env)
    py = shlex.quote(sys.executable)
    ready = shows_run(run_id)
    watch = f"{py} -c {shlex.quote(CONSOLE)} watch {run_id}"
    cases: dict[str, tuple[str, Callable[[str], bool], str | None]] = {
        "trainroom watch RUN": (watch, ready, None),
        "trainroom": (f"{py} -c {shlex.quote(CONSOLE)}", ready, None),
        "top": ("top", lambda text: "load average" in text, None),
        "textual hello": (f"{py} -c {shlex.quote(HELLO)}", lambda text: "hello-frame" in text, None),
    }
    if args.before:
        cases["before: watch RUN"] = (watch, ready, os.path.abspath(args.before))
    walls: dict[str, list[float]] = {k: [] for k in cases}
    cpus: dict[str, list[float]] = {k: [] for k in cases}
    settled: dict[str, list[float]] = {k: [] for k in cases}
    try:
        _tmux(sock, "new-session", "-d", "-s", "bench", "-x", str(cols), "-y", str(rows), "cat", env=env)
        for name in ("PYTHONPATH", "TRAINROOM_HOME", "PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"):
            if name in env:
                _tmux(sock, "set-environment", "-g", name, env[name])
            else:
                _tmux(sock, "set-environment", "-g", "-u", name)
        for round in range(args.rounds + 1):  # the first: the warm-up (the bytecode written)
            for name, (command, ok, other_src) in cases.items():
                wall, cpu, later = one(sock, command, ok, args.poll, 60.0, args.settle, other_src)
                if round > 0:
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                    settled[name].append(later)
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, stdin=subprocess.DEVNULL)
        stopped = stop_demo(env, run_id)
    print(
        f"sources: {src}; {args.rounds} rounds; a {cols}x{rows} tmux window; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    print(
        f"{'command':22s} {'wall s (median)':>16s} {'max':>6s} {'x top':>7s} {'x textual hello':>16s} "
        f"{'its CPU s (median)':>19s} {'CPU x textual hello':>20s} {f'CPU s {args.settle:g} s later':>18s}"
    )
    hello = "textual hello"
    for name, values in walls.items():
        x_top = statistics.median(a / b for a, b in zip(values, walls["top"], strict=True))
        x_hello = statistics.median(a / b for a, b in zip(values, walls[hello], strict=True))
        cpu_x = statistics.median(a / max(b, 1e-3) for a, b in zip(cpus[name], cpus[hello], strict=True))
        print(
            f"{name:22s} {statistics.median(values):16.2f} {max(values):6.2f} {x_top:6.2f}x {x_hello:15.2f}x "
            f"{statistics.median(cpus[name]):19.2f} {cpu_x:19.2f}x {statistics.median(settled[name]):18.2f}"
        )
    if stopped:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
