"""`trainroom demo`: the bundled trainer under a keeper, with the control room open; on the CPU by
default, on a GPU with `--device cuda[:N]` (its VRAM panel then shows its own allocator against
the driver, and the GPU faults are real CUDA processes instead of the fake driver's rows)."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

from trainroom.core.actions.offered import offered_only
from trainroom.core.configuration import argtypes
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.demo.faults import FAULTS
from trainroom.core.ops.doctor import TorchView, torch_view
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperGone, snapshot
from trainroom.core.run.launch import launch
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines

NVML_FAULTS = {"ghost-memory", "orphan-context", "gpu-throttle"}
# The demo ends by itself: this many steps (at the default --step-delay, a few minutes on a CPU),
# and always DEMO_STEPS_PAST_FAULT past a later --fault-step, so the fault plays out before the end.
DEMO_STEPS = 3000
DEMO_STEPS_PAST_FAULT = 1000
FOREVER_STEPS = 10**12


def add_demo_parser(sub: Any, func: Callable[[argparse.Namespace], int]) -> None:
    sp = sub.add_parser("demo", help="run the bundled trainer under a keeper and open the control room")
    sp.add_argument(
        "--device",
        type=device_arg,
        default="cpu",
        help="cpu (default), or cuda / cuda:N: train on that GPU, faults included",
    )
    sp.add_argument(
        "--fault",
        choices=FAULTS,
        default="none",
        metavar="NAME",
        help="play one failure trainroom catches, for real: " + ", ".join(FAULTS) + " (docs/scenarios.md)",
    )
    sp.add_argument(
        "--fault-step",
        type=argtypes.count(1, 10**9),
        default=None,
        metavar="N",
        help="the step the fault fires at (default 30)",
    )
    sp.add_argument(
        "--steps",
        type=argtypes.count(1, 10**9),
        default=None,
        metavar="N",
        help=f"end after N steps (default {DEMO_STEPS}, a few minutes on a CPU; "
        f"{DEMO_STEPS_PAST_FAULT} past --fault-step when that is later)",
    )
    sp.add_argument(
        "--forever", action="store_true", help="train until stopped (`trainroom kill RUN`), not N steps"
    )
    sp.add_argument(
        "--ranks",
        type=argtypes.count(1, 64),
        default=None,
        metavar="N",
        help="run under torchrun with N CPU ranks (gloo; default 1, 2 for --fault rank-outlier)",
    )
    sp.add_argument(
        "--lr",
        type=argtypes.positive(10.0),
        default=None,
        help="the learning rate (default 3e-3; 1e-4 under --fault lr-override)",
    )
    sp.add_argument(
        "--step-delay",
        type=argtypes.seconds(0, 60),
        default=0.05,
        metavar="SECONDS",
        help="sleep per step, so the demo is watchable (default 0.05; 0 = flat out)",
    )
    sp.add_argument(
        "--ckpt-every",
        type=argtypes.count(1, 10**9),
        default=None,
        metavar="N",
        help="save a checkpoint every N steps (default 50; 10 under --fault spike, so that `trainroom "
        "replay RUN --step 31` has step 30's checkpoint to replay from)",
    )
    sp.add_argument(
        "--tracer", action="store_true", help="name the first module whose output goes non-finite"
    )
    sp.add_argument(
        "--eval",
        action="store_true",
        help="gate promotion by the demo's own evaluation (eval_loss on fixed batches); "
        "a checkpoint that regresses is held back",
    )
    sp.add_argument(
        "--no-tui", action="store_true", help="print status lines instead of opening the control room"
    )
    sp.add_argument(
        "--detach", action="store_true", help="print the run id and return (`trainroom watch RUN` opens it)"
    )
    sp.add_argument(
        "--auto-resume",
        type=argtypes.count(0, 100),
        default=None,
        metavar="N",
        help="resume by itself from the last verified checkpoint, at most N times (default 0: off)",
    )
    sp.add_argument(
        "--linger",
        dest="linger_s",
        type=argtypes.seconds(0, 30 * 86400),
        default=None,
        metavar="SECONDS",
        help="how long the keeper stays after the trainer ends with no control room attached "
        "(default 60; 3600 after a death, for its resume)",
    )
    sp.add_argument(
        "--theme",
        dest="watch_theme",
        metavar="NAME",
        help="the control room's theme: dark (default), light, contrast, or one of yours in "
        "$TRAINROOM_HOME/themes (docs/control-room.md)",
    )
    sp.set_defaults(func=func)


def device_arg(text: str) -> str:
    """cpu, cuda or cuda:N (argparse's type: a bad one is a usage error, not a traceback)."""
    if not re.fullmatch(r"cpu|cuda(:\d{1,3})?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def cuda_refusal(device: str, torch: TorchView) -> str | None:
    """Why the demo cannot train on `device` with this torch, in one line; None: it can."""
    if device == "cpu":
        return None
    index = int(device.partition(":")[2] or 0)
    where = f"torch {torch.version} in {torch.python}"
    if not torch.importable or torch.version is None:
        return f"--device {device} needs torch with CUDA; {torch.python} cannot import torch ({torch.error or 'not installed'})"
    if torch.cuda_build is None:
        return f"--device {device} needs torch with CUDA; {where} is a CPU build"
    if not torch.cuda_available or torch.device_count == 0:
        why = f": {torch.error}" if torch.error else ""
        return f"--device {device}: {where} (CUDA {torch.cuda_build}) sees no GPU{why}"
    if index >= torch.device_count:
        return f"--device {device}: {where} sees {torch.device_count} GPU(s), so no device {index}"
    return None


# The checkpoint cadence a fault's story needs where the default (50) would not serve it: the
# spike's replay starts from the last verified checkpoint before the step it replays.
SPIKE_CKPT_EVERY: dict[str | None, int] = {"spike": 10}


def demo_command(args: argparse.Namespace) -> list[str]:
    trainer = ["-m", "trainroom.core.demo.train"]
    device = getattr(args, "device", "cpu")
    if device != "cpu":
        trainer += ["--device", device]
    for flag, val in (
        ("--fault", args.fault),
        ("--fault-step", args.fault_step),
        ("--steps", demo_steps(args)),
        ("--lr", args.lr),
        ("--step-delay", args.step_delay),
        (
            "--ckpt-every",
            args.ckpt_every if args.ckpt_every is not None else SPIKE_CKPT_EVERY.get(args.fault),
        ),
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


def demo_steps(args: argparse.Namespace) -> int:
    """The steps the demo trains: --steps, else a bounded default past the fault (--forever: no end)."""
    if getattr(args, "forever", False):
        return FOREVER_STEPS
    if args.steps is not None:
        return int(args.steps)
    return max(DEMO_STEPS, (args.fault_step or 0) + DEMO_STEPS_PAST_FAULT)


def demo_dir() -> Any:
    d = runs.ensure_state_dir() / "demo"
    d.mkdir(exist_ok=True, mode=0o700)
    return d


def demo_options(args: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(
        demo=True,
        # On a GPU the GPU faults are real processes the real driver lists; the fake driver
        # stands in for them only on the CPU.
        fake_nvml=args.fault in NVML_FAULTS and getattr(args, "device", "cpu") == "cpu",
        lock_files=[str(demo_dir() / "train.lock")] if args.fault == "orphan-context" else [],
        disk_budget_bytes=160 << 20 if args.fault == "disk-fill" else None,
        auto_resume=args.auto_resume,
        linger_s=args.linger_s,
        eval_command=demo_eval_command() if getattr(args, "eval", False) else None,
    )


def demo_eval_command() -> str:
    """The demo's own evaluation as an [eval] command template."""
    return f"{shlex.quote(sys.executable)} -m trainroom.core.demo.evaluate {{ckpt}}"


def run_demo(args: argparse.Namespace, open_tui: Callable[[argparse.Namespace], int]) -> int:
    """Launch the demo; then the control room through `open_tui` (the CLI's hook), or status
    lines each second with --no-tui."""
    device = getattr(args, "device", "cpu")
    if device != "cpu":
        why = cuda_refusal(device, torch_view(sys.executable))
        if why is not None:
            print(f"trainroom demo: {why}", file=sys.stderr)
            return 2
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
            d = offered_only(st, status_dict(st, keeper_alive=alive), keeper_alive=alive)
            print("\n".join(status_lines(d)), flush=True)
            if d["state"] in ("exited", "dead", "stopped") or not alive:
                return 0 if d["state"] == "exited" else 1
            time.sleep(1.0)
    except KeyboardInterrupt:
        print(f"\nleft running: {info.run_id}")
        return 0
