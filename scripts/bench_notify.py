"""Does telling someone slow the keeper down? kill -9 -> `dead` as a subscribed client sees it,
with no alert channel, a receiver that answers at once, one that answers 500 (retried), and one
that hangs with a request already in flight (the channel's worker is stuck when the death comes);
and kill -9 -> the DEAD alert at a receiver that answers.

Real keepers, a light instrumented trainer (no torch) stepping every --interval s, real HTTP
receivers on 127.0.0.1. p50/p99 over the trials, each case against the no-channel one.

    python scripts/bench_notify.py [--trials 20] [--interval 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TRAINER = """
import sys, time
from trainroom.core import sdk
rep = sdk.connect(lr=1e-3)
interval = float(sys.argv[1])
step = 0
while True:
    time.sleep(interval)
    step += 1
    rep.step(step, loss=2.0, tokens=step * 512)
"""

CASES = ("none", "ok", "fail-500", "hanging")


class Receiver:
    """Answers 200, 500, or holds each request until released; notes when each DEAD alert came."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = threading.Event()
        self.dead_at: list[float] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if json.loads(body).get("ident") == "DEAD":
                    owner.dead_at.append(time.time())
                if owner.mode == "hanging":
                    owner.release.wait(120)
                self.send_response(500 if owner.mode == "fail-500" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _test_alert(sock: str) -> None:
    from trainroom.core.run.client import KeeperClient, KeeperGone

    try:
        KeeperClient(sock).call("notify-test", confirm=True, timeout_s=None)
    except KeeperGone:
        pass  # the trial ended and took the keeper with it


def trial(case: str, interval: float, script: Path) -> tuple[float, float | None]:
    """(kill -> dead at a client, kill -> DEAD alert at the receiver or None)."""
    from trainroom.core.configuration.settings import LaunchOptions, NotifyOptions
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import KeeperClient
    from trainroom.core.run.launch import launch
    from trainroom.core.wire import protocol

    rx = Receiver(case) if case != "none" else None
    notify = NotifyOptions(webhook=[rx.url], min_severity="critical") if rx else NotifyOptions()
    opts = LaunchOptions(linger_s=2, notify=notify)
    info = launch([sys.executable, str(script), str(interval)], opts)
    c = KeeperClient(info.sock)
    st = c.subscribe(client="bench")
    killed: float | None = None
    try:
        if case == "hanging":  # the channel's worker is stuck on a test alert when the trainer dies
            threading.Thread(target=_test_alert, args=(info.sock,), daemon=True).start()
        for batch in c.records(timeout_s=120):
            for r in batch:
                st.apply(r)
                if isinstance(r, protocol.RunStatus) and r.state == "dead" and killed is not None:
                    seen = time.time() - killed
                    alert = None
                    if rx is not None and case == "ok":
                        deadline = time.monotonic() + 30
                        while not rx.dead_at and time.monotonic() < deadline:
                            time.sleep(0.005)
                        alert = rx.dead_at[0] - killed if rx.dead_at else None
                    return seen, alert
            a = st.attempt
            if killed is None and a is not None and (st.current_step() or 0) >= 30:
                killed = time.time()
                os.kill(a.pid, signal.SIGKILL)
        raise RuntimeError("no verdict")
    finally:
        c.close()
        if rx is not None:
            rx.close()
        runs.stop_run(info.run_dir)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.05)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="trn", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    (Path(home) / "trainroom.toml").write_text("[notify]\nretries = 3\nbackoff_s = 0.05\ntimeout_s = 60\n")
    script = Path(home) / "trainer.py"
    script.write_text(TRAINER)
    rows: dict[str, list[float]] = {}
    alerts: list[float] = []
    try:
        for case in CASES:
            secs = []
            for _ in range(args.trials):
                s, a = trial(case, args.interval, script)
                secs.append(s)
                if a is not None:
                    alerts.append(a)
            rows[case] = secs
    finally:
        shutil.rmtree(home, ignore_errors=True)
    base = statistics.median(rows["none"])
    print(f"{'channel':10} {'n':>3} {'p50 s':>8} {'p99 s':>8} {'max s':>8} {'p50 vs none':>12}")
    for case, secs in rows.items():
        p50 = statistics.median(secs)
        print(
            f"{case:10} {len(secs):3d} {p50:8.4f} {_pct(secs, 0.99):8.4f} {max(secs):8.4f} {p50 / base:11.2f}x"
        )
    if alerts:
        print(
            f"kill -9 -> DEAD alert at the receiver: n {len(alerts)}, p50 {statistics.median(alerts):.4f} s, "
            f"p99 {_pct(alerts, 0.99):.4f} s, max {max(alerts):.4f} s"
        )
    print(f"step interval {args.interval} s; {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
