"""Text screenshots of the control room's main screen, from a real demo run in real tmux panes.

Starts `trainroom demo --fault silent-death` (scenario 1) detached, opens `trainroom watch RUN` in
one tmux pane per size, waits until the run is DEAD with its last checkpoint verified, and writes
what each pane shows (`tmux capture-pane -p`) to OUT/main-COLSxROWS.txt; then, at 80x24, the DEAD
finding opened (Enter: finding-80x24.txt), the runs overview (o: runs-80x24.txt) and the
trainer log reached with its number where the layout has no room for it (0: log-80x24.txt).

    python scripts/capture_screens.py [--out docs/screenshots] [--fault-step 120]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = ((80, 24), (160, 48))


def _tmux(sock: str, *args: str) -> str:
    out = subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    if out.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/screenshots")
    ap.add_argument("--fault-step", type=int, default=120)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after DEAD before capturing")
    args = ap.parse_args()
    near = Path(sys.executable).with_name("trainroom")
    script = str(near) if near.exists() else shutil.which("trainroom")
    if script is None or shutil.which("tmux") is None:
        print("capture_screens: needs tmux and the trainroom console script", file=sys.stderr)
        return 2
    home = tempfile.mkdtemp(prefix="trs", dir="/tmp")
    os.environ["TRAINROOM_HOME"] = home
    env = {**os.environ, "TRAINROOM_HOME": home}
    out = subprocess.run(
        [
            script,
            "demo",
            "--detach",
            "--fault",
            "silent-death",
            "--fault-step",
            str(args.fault_step),
            "--ckpt-every",
            str(args.ckpt_every),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if out.returncode != 0:
        print(f"capture_screens: demo failed: {out.stderr.strip()}", file=sys.stderr)
        return 1
    run_id = out.stdout.strip()
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import current_state
    from trainroom.core.run.status import status_dict

    info = runs.resolve_run(run_id)
    sock = os.path.join(home, "tmux.sock")
    try:
        watch = f"{shlex.quote(script)} watch {run_id}"
        for w, h in SIZES:  # one session per size: a session's windows share its size
            _tmux(
                sock,
                "new-session",
                "-d",
                "-s",
                f"{w}x{h}",
                "-x",
                str(w),
                "-y",
                str(h),
                "-e",
                f"TRAINROOM_HOME={home}",
                watch,
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            st, _ = current_state(runs.resolve_run(run_id))
            d = status_dict(st)
            dead = next((f for f in d["findings"] if f["code"] == "DEAD"), None)
            if dead and dead["evidence"].get("last_verified_step"):
                break
            time.sleep(0.5)
        else:
            print("capture_screens: the run never died with a verified checkpoint", file=sys.stderr)
            return 1
        time.sleep(args.settle)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for w, h in SIZES:
            size = _tmux(sock, "display-message", "-p", "-t", f"{w}x{h}:", "#{pane_width}x#{pane_height}")
            if size.strip() != f"{w}x{h}":
                print(f"capture_screens: pane is {size.strip()}, not {w}x{h}", file=sys.stderr)
                return 1
            text = _tmux(sock, "capture-pane", "-p", "-t", f"{w}x{h}:")
            path = Path(args.out) / f"main-{w}x{h}.txt"
            path.write_text(text)
            print(f"{path}: {len(text.splitlines())} lines")
        for name, keys, back in (
            ("finding", ["Enter"], ["Escape"]),  # the findings have the focus from the start
            ("runs", ["o"], ["Escape"]),
            ("log", ["0"], ["Escape"]),  # its number: a hidden panel opens zoomed
        ):
            target = "80x24:"
            for key in keys:
                _tmux(sock, "send-keys", "-t", target, key)
                time.sleep(0.5)
            time.sleep(args.settle)
            path = Path(args.out) / f"{name}-80x24.txt"
            path.write_text(_tmux(sock, "capture-pane", "-p", "-t", target))
            print(f"{path}")
            for key in back:
                _tmux(sock, "send-keys", "-t", target, key)
                time.sleep(0.5)
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, timeout=30)
        runs.stop_run(info.run_dir)
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
