"""What the `trainroom` command costs against a bare Python start (the least any Python CLI costs),
and how soon the control room shows its first frame.

    python scripts/bench_cli.py [--pairs 15] [--src OTHER/src]

Also what a trainer pays for `import trainroom; trainroom.connect()` (the SDK, outside a keeper).
Each pair runs `python -c pass` and the command back to back (the same load on both) and takes the
CPU (user + sys) of the child from getrusage(RUSAGE_CHILDREN); the ratio printed is the median over
the pairs. The commands run as the console script does (`from trainroom.cli import main`), on a
finished run in a temporary TRAINROOM_HOME. Goals: `status` of a finished run <= 5x,
`--help` <= 3x; the control room's first frame, from the process's start, within 1 s (wall).
`--src` measures another checkout's sources (the code before a change) the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONSOLE = "import sys; from trainroom.cli import main; sys.exit(main())"
# The README's first SDK line; a tree from before the package's top was the SDK takes its own.
SDK = """
import trainroom
try:
    trainroom.connect()
except AttributeError:
    from trainroom.core import sdk
    sdk.connect()
"""

FIRST_FRAME = r"""
import asyncio, sys, time
t0 = float(sys.argv[1])
from trainroom.tui.app import ControlRoom

async def go():
    app = ControlRoom(sys.argv[2])
    async with app.run_test(size=(160, 48)) as pilot:
        while app.state is None:
            await pilot.pause(0.005)
        await pilot.pause()
        print(time.time() - t0, time.process_time())

asyncio.run(go())
"""


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """User + sys CPU seconds of one child process (and its children, waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def finished_run(env: dict[str, str]) -> str:
    """A run whose trainer ended and whose keeper is gone: what `status` in a loop mostly sees."""
    py = [sys.executable, "-c", CONSOLE]
    out = subprocess.run([*py, "launch", "--", sys.executable, "-c", "pass"], env=env, capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"launch failed: {out.stderr.decode()}")
    run_id = out.stdout.decode().split()[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = subprocess.run([*py, "status", run_id, "--json"], env=env, capture_output=True)
        if st.returncode == 0 and json.loads(st.stdout)["keeper"] == "gone":
            return run_id
        time.sleep(0.5)
    raise SystemExit(f"the keeper of {run_id} did not end within 120 s")


def first_frame(env: dict[str, str], run_id: str) -> tuple[float, float]:
    """(wall seconds from spawning the process, its own CPU seconds) to the first frame."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_FRAME, repr(time.time()), run_id],
        env=env,
        capture_output=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"the control room failed: {done.stderr.decode()[-800:]}")
    wall, cpu = done.stdout.decode().strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--frames", type=int, default=5, help="first-frame runs (wall seconds each)")
    ap.add_argument("--src", help="another checkout's src/ to measure instead of this one's")
    args = ap.parse_args()
    src = args.src or str(Path(__file__).resolve().parents[1] / "src")
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as home:
        os.chmod(home, 0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINROOM_")}
        env |= {"PYTHONPATH": src, "TRAINROOM_HOME": home}
        run_id = finished_run(env)
        bare = [sys.executable, "-c", "pass"]
        cases = {
            "--help": [sys.executable, "-c", CONSOLE, "--help"],
            f"status {run_id}": [sys.executable, "-c", CONSOLE, "status", run_id],
            "status --json": [sys.executable, "-c", CONSOLE, "status", run_id, "--json"],
            # What a trainer pays for the SDK (outside a keeper: connect is a no-op).
            "import trainroom": [sys.executable, "-c", "import trainroom"],
            "import trainroom; trainroom.connect()": [sys.executable, "-c", SDK],
        }
        ratios: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in ("python -c pass", *cases)}
        for _ in range(args.pairs):
            for name, argv in cases.items():
                b, c = cpu_of(bare, env), cpu_of(argv, env)
                cpu["python -c pass"].append(b)
                cpu[name].append(c)
                ratios[name].append(c / max(b, 1e-6))
        frames = [first_frame(env, run_id) for _ in range(args.frames)]
    print(f"sources: {src}; {args.pairs} pairs; CPU = user + sys of the child")
    print(f"{'command':40s} {'CPU ms (median)':>16s} {'x bare python (median of pairs)':>32s}")
    for name, values in cpu.items():
        ratio = f"{statistics.median(ratios[name]):.2f}x" if name in ratios else "1x"
        print(f"{name:40s} {statistics.median(values) * 1000:16.1f} {ratio:>32s}")
    walls, cpus = [f[0] for f in frames], [f[1] for f in frames]
    print(
        f"control room, process start -> first frame with the run's state ({args.frames} runs): "
        f"wall median {statistics.median(walls):.2f} s (max {max(walls):.2f} s), "
        f"its own CPU median {statistics.median(cpus):.2f} s; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
