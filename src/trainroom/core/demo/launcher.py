"""`trainroom demo`: the bundled CPU trainer under a keeper, with the control room open."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from trainroom.core import argtypes
from trainroom.core.demo.faults import FAULTS
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperGone, snapshot
from trainroom.core.run.launch import launch
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.settings import LaunchOptions

NVML_FAULTS = {"ghost-memory", "orphan-context"}


def add_demo_parser(sub: Any, func: Callable[[argparse.Namespace], int]) -> None:
    sp = sub.add_parser("demo", help="run the bundled CPU trainer under a keeper and open the control room")
    sp.add_argument("--fault", choices=FAULTS, default="none", help="reproduce one scenario of SCENARIOS.md")
    sp.add_argument("--fault-step", type=argtypes.count(1, 10**9), default=None)
    sp.add_argument(
        "--steps",
        type=argtypes.count(1, 10**9),
        default=None,
        help="stop after this many steps (default: run on)",
    )
    sp.add_argument(
        "--ranks",
        type=argtypes.count(1, 64),
        default=None,
        help="run under torchrun with this many CPU ranks (gloo)",
    )
    sp.add_argument("--lr", type=argtypes.positive(10.0), default=None)
    sp.add_argument(
        "--step-delay",
        type=argtypes.seconds(0, 60),
        default=0.05,
        help="seconds of sleep per step, so the demo is watchable (default 0.05; 0 = flat out)",
    )
    sp.add_argument("--ckpt-every", type=argtypes.count(1, 10**9), default=None)
    sp.add_argument("--tracer", action="store_true", help="name the first non-finite module")
    sp.add_argument(
        "--no-tui", action="store_true", help="print status lines instead of opening the control room"
    )
    sp.add_argument("--detach", action="store_true", help="print the run id and return")
    sp.add_argument("--auto-resume", type=argtypes.count(0, 100), default=None, metavar="N")
    sp.add_argument("--linger", dest="linger_s", type=argtypes.seconds(0, 30 * 86400), default=None)
    sp.add_argument("--theme", dest="watch_theme")
    sp.set_defaults(func=func)


def demo_command(args: argparse.Namespace) -> list[str]:
    trainer = ["-m", "trainroom.core.demo.train"]
    for flag, val in (
        ("--fault", args.fault),
        ("--fault-step", args.fault_step),
        ("--steps", args.steps),
        ("--lr", args.lr),
        ("--step-delay", args.step_delay),
        ("--ckpt-every", args.ckpt_every),
    ):
        if val is not None and not (flag == "--fault" and val == "none"):
            trainer += [flag, str(val)]
    if args.tracer or args.fault == "nan":
        trainer.append("--tracer")
    if args.fault == "orphan-context":
        trainer += ["--lock-file", str(demo_dir() / "train.lock")]
    ranks = args.ranks or (2 if args.fault == "rank-outlier" else 1)
    if ranks > 1:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            *trainer,
        ]
    return [sys.executable, *trainer]


def demo_dir() -> Any:
    d = runs.state_dir() / "demo"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def demo_options(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(
        demo=True,
        fake_nvml=args.fault in NVML_FAULTS,
        lock_files=[str(demo_dir() / "train.lock")] if args.fault == "orphan-context" else [],
        disk_budget_bytes=160 << 20 if args.fault == "disk-fill" else None,
        auto_resume=args.auto_resume,
        linger_s=args.linger_s,
    )


def run_demo(args: argparse.Namespace, open_tui: Callable[[argparse.Namespace], int]) -> int:
    """Launch the demo; then the control room through `open_tui` (the CLI's hook), or status
    lines each second with --no-tui."""
    info = launch(demo_command(args), demo_options(args), cwd=str(demo_dir()))
    if args.detach:
        print(info.run_id)
        return 0
    if not args.no_tui:
        args.run = info.run_id
        return open_tui(args)
    print(f"run {info.run_id}  (trainroom status {info.run_id} --json; Ctrl-C leaves it running)")
    try:
        while True:
            try:
                st = snapshot(info.sock)
                alive = True
            except KeeperGone:
                st, alive = runs.load_state(info.run_dir), False
            d = status_dict(st, keeper_alive=alive)
            print("\n".join(status_lines(d)), flush=True)
            if d["state"] in ("exited", "dead", "stopped") or not alive:
                return 0 if d["state"] == "exited" else 1
            time.sleep(1.0)
    except KeyboardInterrupt:
        print(f"\nleft running: {info.run_id}")
        return 0
