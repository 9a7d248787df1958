"""How `trainroom export` takes a burst of concurrent scrapes: N live runs (real keepers, a light
instrumented trainer each), one exporter, then C scrapes fired at once (one thread each, a
connect+read timeout each); latency p50/p95/max and how many failed or timed out.

    python scripts/bench_export.py [--runs 3] [--concurrent 200] [--timeout 10] [--rounds 3]
    python scripts/bench_export.py --src /path/to/other/checkout/src   # the exporter of another tree

The runs and the exporter live under a temporary TRAINROOM_HOME, stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TRAINER = """
import time
from trainroom.core import sdk
rep = sdk.connect(lr=1e-3)
step = 0
while True:
    time.sleep(0.05)
    step += 1
    rep.step(step, loss=2.0, tokens=step * 512)
"""


def _scrape(url: str, timeout: float, out: list[tuple[float, str]], go: threading.Event) -> None:
    go.wait()
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
        out.append((time.monotonic() - t0, "ok" if b"trainroom_runs_live" in body else "bad body"))
    except Exception as exc:  # a timeout, a reset: counted by kind
        out.append((time.monotonic() - t0, type(exc).__name__))


def burst(url: str, n: int, timeout: float) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    go = threading.Event()
    threads = [threading.Thread(target=_scrape, args=(url, timeout, out, go)) for _ in range(n)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="trbx", dir="/tmp"))
    env = {**os.environ, "TRAINROOM_HOME": str(home), "PYTHONPATH": args.src}
    env.pop("TRAINROOM_SOCKET", None)
    script = home / "trainer.py"
    script.write_text(TRAINER)
    cli = [sys.executable, "-m", "trainroom.cli"]
    exporter = None
    try:
        for _ in range(args.runs):
            subprocess.run(
                [*cli, "launch", "--linger", "60", "--", sys.executable, str(script)],
                env=env,
                cwd=home,
                check=True,
                capture_output=True,
            )
        exporter = subprocess.Popen(
            [*cli, "export", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert exporter.stdout is not None
        url = exporter.stdout.readline().split()[1]
        burst(url, 1, 30.0)  # warm: the first scrape imports what a scrape needs
        print(f"exporter {url} from {args.src}: {args.runs} live runs, {args.concurrent} concurrent scrapes")
        for r in range(args.rounds):
            res = burst(url, args.concurrent, args.timeout)
            lat = sorted(t for t, what in res if what == "ok")
            failed: dict[str, int] = {}
            for _, what in res:
                if what != "ok":
                    failed[what] = failed.get(what, 0) + 1
            q = statistics.quantiles(lat, n=20) if len(lat) >= 2 else [float("nan")] * 19
            print(
                f"round {r + 1}: ok {len(lat)}/{len(res)}  p50 {statistics.median(lat) if lat else float('nan'):.3f} s  "
                f"p95 {q[18]:.3f} s  max {max(lat) if lat else float('nan'):.3f} s  failed {failed or 'none'}"
            )
    finally:
        if exporter is not None:
            exporter.kill()
            exporter.wait()
        _stop_under(home)
        shutil.rmtree(home, ignore_errors=True)
    return 0


def _stop_under(home: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.waiting import kill_runs_under

    kill_runs_under(home)


if __name__ == "__main__":
    sys.exit(main())
