"""What the output pump costs a trainer that prints: steps per second of a loop that prints a
line a step (a light step: a little arithmetic, then `print`), with its stdout

  - `pump`: under a keeper of this tree (a pipe drained by the output pump into trainer.log),
  - `file`: under a keeper of another tree (--src, e.g. main's `src/`, where the trainer's stdout
    is trainer.log itself), when --src is given,
  - `direct`: no keeper, stdout a plain file on the same disk (the floor).

Each mode runs --repeat times; the median is printed. --line sets the bytes per line (a tqdm bar
is ~100, a logged dict ~300, a traceback burst 4096).

    python scripts/bench_trainer_output.py [--steps 200000] [--line 120] [--repeat 3] [--src PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINER = """
import sys, time
steps, width, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pad = "." * max(0, width - 40)
acc = 0.0
t0 = time.perf_counter()
for step in range(1, steps + 1):
    acc += (step % 7) * 0.5
    print(f"step {step:>8} loss {acc % 3:.4f} {pad}")
rate = steps / (time.perf_counter() - t0)
with open(out, "w") as f:
    f.write(str(rate))
"""


def _wait_file(path: Path, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return float(path.read_text())
        time.sleep(0.1)
    raise SystemExit(f"no result in {path} after {timeout:.0f} s")


def under_keeper(src: str, home: Path, steps: int, width: int, n: int) -> float:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRAINROOM_HOME": str(home), "PYTHONPATH": src}
    env.pop("TRAINROOM_SOCKET", None)
    out = home / f"rate-{n}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainroom.cli",
            "launch",
            "--linger",
            "5",
            "--",
            sys.executable,
            str(home.parent / "trainer.py"),
            str(steps),
            str(width),
            str(out),
        ],
        env=env,
        cwd=home,
        check=True,
        capture_output=True,
    )
    return _wait_file(out, 600)


def direct(home: Path, steps: int, width: int, n: int) -> float:
    out = home / f"direct-{n}"
    with open(home / f"direct-{n}.log", "ab") as log:
        subprocess.run(
            [sys.executable, str(home / "trainer.py"), str(steps), str(width), str(out)],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return _wait_file(out, 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--line", type=int, default=120)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--src", default=None, help="another tree's src/: its keeper writes stdout to the file")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    home = Path(tempfile.mkdtemp(prefix="trbo", dir="/tmp"))
    (home / "trainer.py").write_text(TRAINER)
    rates: dict[str, list[float]] = {"pump": [], "file": [], "direct": []}
    try:
        for n in range(args.repeat):
            rates["pump"].append(under_keeper(here, home / f"p{n}", args.steps, args.line, n))
            if args.src:
                rates["file"].append(under_keeper(args.src, home / f"f{n}", args.steps, args.line, n))
            rates["direct"].append(direct(home, args.steps, args.line, n))
    finally:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.waiting import kill_runs_under

        for d in home.iterdir():
            if d.is_dir():
                kill_runs_under(d)
        shutil.rmtree(home, ignore_errors=True)
    print(f"{args.steps} steps, a {args.line}-byte line each (PYTHONUNBUFFERED: a write per line)")
    for mode, got in rates.items():
        if got:
            med = statistics.median(got)
            print(
                f"  {mode:<7} {med:>10,.0f} steps/s  ({med * args.line / 1e6:.1f} MB/s; runs: {', '.join(f'{r:,.0f}' for r in got)})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
