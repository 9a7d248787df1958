"""The processes scripts/gpu_check.py starts: a CUDA trainer under a keeper, and what it spawns.

    trainer    --device D --mib N --lock PATH --control DIR
               reports a step every 0.05 s through the SDK (allocator view included) while
               holding N MiB on D and an flock on PATH; reacts to files gpu_check writes in DIR:
                 ghost  -> spawns a `holder` in the trainer's process group (memory the run's
                           allocator does not see: GHOST_MEMORY names the holder's pid)
                 strand -> spawns a `straggler` that inherits the flock, waits until it is
                           stopped, then dies by SIGKILL (STALE_LOCK, ORPHAN_CONTEXT)
    holder     --device D --mib N --ready PATH   holds N MiB until its parent is gone
    straggler  --device D --mib N --ready PATH   leaves the trainer's group (setsid), holds N MiB
               and the inherited flock, then stops itself (SIGSTOP); ends when continued

With --device cpu the same processes run on the CPU (gpu_check's rehearsal: the plumbing without
a GPU). Every role writes its pid to --ready once its memory is held.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
STEP_S = 0.05


def hold(device: str, mib: int) -> Any:
    """N MiB on the device, really allocated (CUDA: synchronised; CPU: every page touched)."""
    if device == "cpu":
        return bytearray(b"\1" * (mib * MIB))
    import torch

    torch.cuda.set_device(torch.device(device))
    block = torch.ones(mib * MIB // 4, dtype=torch.float32, device=device)
    torch.cuda.synchronize()
    return block


def ready(path: str) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(str(os.getpid()))
    os.replace(tmp, path)


def wait_ready(path: Path, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return int(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")


def _spawn(
    role: str, args: argparse.Namespace, ready_path: Path, mib: int, **popen: Any
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        __file__,
        role,
        "--device",
        args.device,
        "--mib",
        str(mib),
        "--ready",
        str(ready_path),
    ]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **popen)


def trainer(args: argparse.Namespace) -> int:
    import torch

    from trainroom.core import sdk

    control = Path(args.control)
    lock = open(args.lock, "a+")  # noqa: SIM115 - held for the whole life of the trainer
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    block = hold(args.device, args.mib)
    dev = torch.device(args.device)
    model = torch.nn.Linear(256, 256).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rep = sdk.connect(lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    children: list[subprocess.Popen[bytes]] = []
    step = 0
    while True:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        rep.step(step, loss=loss.item(), tokens=step * 64, optimizer=opt)
        if (control / "ghost").exists() and not (control / "ghost.started").exists():
            (control / "ghost.started").touch()
            children.append(_spawn("holder", args, control / "ghost.ready", args.ghost_mib))
        if (control / "strand").exists():
            # The straggler inherits the flock's descriptor, as a worker forked mid-run does.
            children.append(
                _spawn(
                    "straggler", args, control / "strand.ready", args.strand_mib, pass_fds=(lock.fileno(),)
                )
            )
            pid = wait_ready(control / "strand.ready")
            deadline = time.monotonic() + 30
            while _state(pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGKILL)  # a silent death, leaving the straggler behind
        time.sleep(STEP_S)
        assert block is not None  # held for the trainer's whole life


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def holder(args: argparse.Namespace) -> int:
    parent = os.getppid()
    block = hold(args.device, args.mib)
    ready(args.ready)
    while os.getppid() == parent:  # gone with the trainer, whoever ends it
        time.sleep(0.2)
    del block
    return 0


def straggler(args: argparse.Namespace) -> int:
    # Out of the trainer's group, as a worker or an async-save child that called setsid: the
    # group kill does not reach it, and the kernel's SIGHUP to a newly orphaned group that has a
    # stopped member (which ends a straggler left inside the group) does not either.
    os.setsid()
    block = hold(args.device, args.mib)
    ready(args.ready)
    os.kill(os.getpid(), signal.SIGSTOP)  # stopped with a context and the flock
    del block
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check_roles.py")
    ap.add_argument("role", choices=("trainer", "holder", "straggler"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--ready")
    ap.add_argument("--lock")
    ap.add_argument("--control")
    ap.add_argument("--ghost-mib", type=int, default=2048)
    ap.add_argument("--strand-mib", type=int, default=1024)
    args = ap.parse_args(argv)
    role = {"trainer": trainer, "holder": holder, "straggler": straggler}[args.role]
    return role(args)


if __name__ == "__main__":
    sys.exit(main())
