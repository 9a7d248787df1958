"""`trainroom doctor [--json]`: what this host allows a run and what it lacks."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from trainroom.core.cli.errors import CliError
from trainroom.core.configuration.settings import ENV_PROC_ROOT, ENV_SYS_ROOT, HostRoots
from trainroom.core.ops.doctor import DoctorOptions, GpuChoice, render, run_doctor
from trainroom.core.run import store
from trainroom.core.units import to_json

EPILOG = """\
Each check is ok, degraded or missing, with what was found and the fix. Exit code 0 when
nothing the configured run needs is missing, 1 when something is, 2 on bad input.

What the run needs (missing when absent): the state dir (writable, private, short enough for a
socket), a trainroom.toml that launch accepts (or none), a writable checkpoint root with room for
a save; and, when the run uses a GPU, NVML and CUDA in the trainer's torch. The run uses a GPU
when told (--gpu) or, unless told --cpu, when the driver or the trainer's torch sees one; so a
CPU-only host is degraded, never missing. Everything else (WSL, 9p/drvfs checkpoints, a full
disk's warning level, low host RAM, the page-cache reclaim method, py-spy and ptrace, ssh) is
degraded when absent: the run works, with less seen or done for it.

The configured run: trainroom.toml in --project (default: here), then the state dir;
--ckpt-root as launch takes it. --json prints the report (keys: README, `trainroom doctor`).
"""


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "doctor",
        help="what this host allows a run and what it lacks (ok / degraded / missing, with the fix)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("--json", action="store_true", help="print the report as JSON")
    which = sp.add_mutually_exclusive_group()
    which.add_argument(
        "--gpu",
        dest="gpu",
        action="store_const",
        const="gpu",
        help="the run uses a GPU: NVML and CUDA are needed",
    )
    which.add_argument(
        "--cpu",
        dest="gpu",
        action="store_const",
        const="cpu",
        help="the run trains on the CPU: no GPU is needed",
    )
    sp.add_argument(
        "--python", metavar="PATH", help="the trainer's interpreter, whose torch is asked (default: this one)"
    )
    sp.add_argument("--project", metavar="DIR", help="the project dir with trainroom.toml (default: here)")
    sp.add_argument(
        "--ckpt-root", metavar="PATH", help="the checkpoint root, as `launch --ckpt-root` takes it"
    )
    sp.set_defaults(func=cmd_doctor, gpu="auto")


def _python(value: str | None) -> str:
    if value is None:
        return sys.executable
    found = shutil.which(value) if os.sep not in value else value
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise CliError(f"--python {value}: not an executable interpreter")
    return os.path.abspath(found)


def _project(value: str | None) -> str:
    path = Path(value).expanduser() if value else Path.cwd()
    if not path.is_dir():
        raise CliError(f"--project {value}: not a directory")
    return str(path.absolute())


def cmd_doctor(args: argparse.Namespace) -> int:
    gpu: GpuChoice = args.gpu
    options = DoctorOptions(
        project_dir=_project(args.project),
        state_dir=str(store.state_dir()),
        python=_python(args.python),
        gpu=gpu,
        ckpt_root=str(Path(args.ckpt_root).expanduser().absolute()) if args.ckpt_root else None,
        roots=HostRoots(
            proc=os.environ.get(ENV_PROC_ROOT, "/proc"),
            cgroup=os.environ.get(ENV_SYS_ROOT, "/sys/fs/cgroup"),
        ),
    )
    report = run_doctor(options)
    if args.json:
        print(to_json(report.as_dict()))
    else:
        print("\n".join(render(report)))
    return 0 if report.ok else 1
