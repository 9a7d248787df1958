"""What a large unrelated directory in the checkpoint root costs: a root holding --files empty
files (in a `data/` sub-directory, or at its top with --top) next to a few verified checkpoints.

Measured: the keeper's CPU share over --seconds (a real keeper, a light instrumented trainer,
`--disk-budget` so the budget's usage is measured too, `--watch-ckpt` on the root), then
`trainroom prune --root ROOT --keep 1 --yes --json` wall time. Run it against another tree's code
with --src (its `src/`) for a before/after.

    python scripts/bench_ckpt_scan.py [--files 100000] [--top] [--seconds 20] [--src PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

TRAINER = """
import time
from trainroom.core import sdk
rep = sdk.connect(lr=1e-3)
step = 0
while True:
    time.sleep(0.05)
    step += 1
    rep.step(step, loss=2.0)
"""

# A few verified checkpoints, promoted through the SDK's own path (no torch: a plain file).
SAVER = """
import sys
from pathlib import Path
import msgspec
from trainroom.core.ckpt import layout
from trainroom.core.ckpt.digest import digest_file
root = Path(sys.argv[1])
for step in (100, 200, 300):
    d = root / f"step-{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.pt").write_bytes(b"x" * 4096)
    m = layout.Manifest(ok=True, file="model.pt", step=step, saved_at=float(step), digest=digest_file(d / "model.pt"))
    (d / layout.MANIFEST).write_bytes(msgspec.json.encode(m))
"""


def _make_root(root: Path, files: int, top: bool, env: dict[str, str]) -> None:
    data = root if top else root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (data / f"f{i:06d}.txt").touch()
    subprocess.run([sys.executable, "-c", SAVER, str(root)], env=env, check=False, capture_output=True)
    # Older than the listing's racy window, as a dataset that sat there is.
    old = time.time() - 60
    for p in (root, data):
        os.utime(p, (old, old))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--top", action="store_true", help="the files at the root's top, not in data/")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trbc", dir="/tmp"))
    env = {**os.environ, "TRAINROOM_HOME": str(home), "PYTHONPATH": args.src}
    env.pop("TRAINROOM_SOCKET", None)
    root = home / "ckpt"
    cli = [sys.executable, "-m", "trainroom.cli"]
    try:
        _make_root(root, args.files, args.top, env)
        (home / "trainer.py").write_text(TRAINER)
        subprocess.run(
            [
                *cli,
                "launch",
                "--linger",
                "30",
                "--ckpt-root",
                str(root),
                "--disk-budget",
                "100G",
                "--watch-ckpt",
                str(root),
                "--",
                sys.executable,
                str(home / "trainer.py"),
            ],
            env=env,
            cwd=home,
            check=True,
            capture_output=True,
        )
        rec = next((home / "runs").iterdir()) / "run.msgpack"
        from trainroom.core.run import store

        keeper = psutil.Process(store.read_record(rec.parent).keeper_pid)
        time.sleep(3.0)  # its start (imports, the first probes) is not the steady state measured
        c0, t0 = keeper.cpu_times(), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = keeper.cpu_times(), time.monotonic()
        share = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0) * 100
        where = "at the root's top" if args.top else "in data/"
        print(f"{args.files} files {where}; code from {args.src}")
        print(f"keeper CPU over {t1 - t0:.0f} s: {share:.1f} %  (rss {keeper.memory_info().rss >> 20} MiB)")
        store.stop_run(rec.parent)
        t = time.monotonic()
        done = subprocess.run(
            [*cli, "prune", "--root", str(root), "--keep", "1", "--yes", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        print(f"prune --root --keep 1: {time.monotonic() - t:.2f} s (exit {done.returncode})")
    finally:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.waiting import kill_runs_under

        kill_runs_under(home)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
