"""Kill -9 a real checkpointing process at random moments; after each kill, `latest` must verify.

    python scripts/stress_checkpoints.py [--trials 60] [--mb 32] [--root DIR] [--seed N]

Each trial starts a writer that saves checkpoints in a loop with the SDK (write into quarantine,
fsync, rename, verify, promote, swap `latest`), waits until it is ready, sleeps a random part of
a save cycle, and SIGKILLs it. Then, as the next save would, it sweeps what the writer left, and
checks that whatever `latest` points at verifies (digest against its manifest included) and that
no half-written file sits outside quarantine. Prints the counts; exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WRITER = textwrap.dedent("""
    import sys, time, torch
    from trainroom.core.ckpt import layout as ck
    from trainroom.core.sdk import save_checkpoint
    root, mb, start = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    n = max(1, int(mb * (1 << 20) / 4 / 8))
    g = torch.Generator().manual_seed(start)
    state = {"model": {f"transformer.h.{i}.mlp.c_fc.weight": torch.randn(n, generator=g) * 0.02 for i in range(8)},
             "iter_num": 0, "config": {"lr": 6e-4}}
    log = open(sys.argv[4], "a", buffering=1)
    print("ready", file=log)
    step = start
    while True:
        state["iter_num"] = step
        state["model"]["transformer.h.0.mlp.c_fc.weight"][0] = float(step)  # each save's bytes differ
        print(f"save {step}", file=log)
        t = time.perf_counter()
        saved = save_checkpoint(state, step, root=root, promote_inline=True)
        print(f"{saved.state} {step} {time.perf_counter() - t:.4f}", file=log)
        step += 1
""")


def phase_of(log: Path) -> str:
    lines = log.read_text().splitlines()
    last = lines[-1].split()[0] if lines else "start"
    return {
        "ready": "before first save",
        "save": "during save/verify/promote",
        "verified": "between saves",
    }.get(last, last)


def check_after_kill(root: Path, trial: int, counts: collections.Counter[str]) -> list[str]:
    """As the next save would: sweep what the killed writer left; then what is outside quarantine
    must be whole, `latest` must verify, and leftover candidates are settled as a keeper would."""
    from trainroom.core.ckpt import layout as ck
    from trainroom.core.ckpt import promote as pm
    from trainroom.core.ckpt import verify as v
    from trainroom.core.ops import prune as prune

    failures: list[str] = []
    done = ck.Quarantine(root).sweep()
    counts["swept: half-written temp files removed"] += sum(x.startswith("removed") for x in done)
    counts["swept: half-done promotions finished"] += sum(x.startswith("finished") for x in done)
    counts["swept: half-done promotions undone"] += sum(x.startswith("undid") for x in done)
    # What is outside quarantine must be whole: step dirs with manifests, and latest.
    for x in root.iterdir():
        if x.name in (ck.LATEST, ck.QUARANTINE):
            continue
        if x.name.startswith(".") or not (x / ck.MANIFEST).is_file():
            failures.append(f"trial {trial}: {x.name} left outside quarantine")
    latest = ck.latest_checkpoint(root)
    if latest is None:
        counts["no latest yet"] += 1
    else:
        rep = v.verify(latest)
        if rep.ok and rep.digest_ok:
            counts["latest verified"] += 1
        else:
            failures.append(f"trial {trial}: latest {latest} failed: {rep.reason}")
    for c in ck.Quarantine(root).candidates():
        # A candidate the kill left unjudged: verify and settle it as a keeper would.
        rec = pm.settle(c, v.verify(c), root)
        counts[f"leftover candidates {rec.state}"] += 1
    counts["bytes pruned"] += prune.prune(root, keep=2).bytes_freed
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--mb", type=float, default=32.0, help="checkpoint size in MB")
    ap.add_argument(
        "--root", type=Path, default=None, help="checkpoint root (default: a temp dir, removed after)"
    )
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if args.trials < 1 or args.mb <= 0:
        print("stress_checkpoints: --trials and --mb must be positive", file=sys.stderr)
        return 2

    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="trstress"))
    root = args.root or tmp / "ck"
    root.mkdir(parents=True, exist_ok=True)
    log = tmp / "writer.log"
    counts: collections.Counter[str] = collections.Counter()
    moments: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    cycle_s = None
    step = 1
    try:
        for trial in range(args.trials):
            log.write_text("")
            proc = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(root), str(args.mb), str(step), str(log)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            deadline = time.monotonic() + 120
            while "ready" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"writer failed to start: {proc.stderr.read().decode()[-2000:]}", file=sys.stderr)
                    return 1
                time.sleep(0.01)
            if cycle_s is None:
                # Calibrate: time two whole save cycles once, then kill anywhere inside ~2 cycles.
                while sum(1 for x in log.read_text().splitlines() if x.startswith("verified")) < 2:
                    if proc.poll() is not None:
                        print(f"writer died: {proc.stderr.read().decode()[-2000:]}", file=sys.stderr)
                        return 1
                    time.sleep(0.01)
                times = [
                    float(x.split()[2]) for x in log.read_text().splitlines() if x.startswith("verified")
                ]
                cycle_s = max(times)
            else:
                time.sleep(rng.uniform(0, 2 * cycle_s))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
            moments[phase_of(log)] += 1
            failures += check_after_kill(root, trial, counts)
            verified = [
                int(x.split()[1]) for x in log.read_text().splitlines() if x.startswith(("verified", "save"))
            ]
            step = max([*verified, step]) + 1
        print(
            f"stress_checkpoints: {args.trials} SIGKILLs of a real save loop, {args.mb:g} MB checkpoints, "
            f"save cycle ~{cycle_s:.3f} s"
        )
        for k, n in moments.most_common():
            print(f"  killed {k}: {n}")
        for k in sorted(counts):
            print(f"  {k}: {counts[k]}")
        print(f"  failures: {len(failures)}")
        for f in failures[:20]:
            print(f"    {f}")
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
