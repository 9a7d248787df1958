"""`trainroom attach [PID] [--log FILE] [--ckpt DIR] [--name NAME]`: watch a trainer trainroom did
not start, under a keeper that adopts it; prints the run id as `launch` does. Without a PID: the
candidates (your processes with torch loaded or a GPU context), and the one picked."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainroom.core.cli.errors import CliError
from trainroom.core.configuration import argtypes
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.probes.adopt import Adoptee, AdoptRefused, Candidate, candidates, inspect
from trainroom.core.run.attach import attach
from trainroom.core.units import fmt_duration


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "attach", help="watch a trainer trainroom did not start (a keeper adopts it); prints the run id"
    )
    sp.add_argument(
        "pid", nargs="?", type=int, help="the trainer's pid (a torchrun worker: its agent); none: list"
    )
    sp.add_argument("--log", metavar="FILE", help="the trainer's log, when its stdout is not a file")
    sp.add_argument("--ckpt", metavar="DIR", help="where it saves checkpoints (default: from its arguments)")
    sp.add_argument("--name", help="a name for the run (its id names it)")
    sp.add_argument(
        "--resume-template",
        dest="resume_template",
        help="the command a takeover resumes with; {ckpt}, {ckpt_dir}, {step} are replaced",
    )
    sp.add_argument(
        "--linger",
        dest="linger_s",
        type=argtypes.seconds(0, 30 * 86400.0),
        help="seconds the keeper stays after the trainer ends with no viewer",
    )
    sp.add_argument(
        "--yes", action="store_true", help="without a PID: never ask (the list is printed, exit 2)"
    )
    sp.set_defaults(func=cmd_attach)


def _gpu_pids() -> set[int]:
    """The pids the driver lists with a context (none where there is no driver view)."""
    from trainroom.core.probes.gpu import GpuProbe

    probe = GpuProbe()
    try:
        sample = probe.sample()
        return {x.pid for x in sample.processes}
    except Exception:  # no driver here: candidates come from /proc alone
        return set()
    finally:
        probe.close()


def _listing(found: list[Candidate]) -> str:
    rows = [
        f"  {i}) pid {c.pid:<8} {fmt_duration(c.age_s):>8}  {c.why:<12}  {c.cmdline[:90]}"
        for i, c in enumerate(found, 1)
    ]
    return "\n".join(rows)


def _pick(args: argparse.Namespace) -> int:
    found = candidates(_gpu_pids())
    if not found:
        raise CliError("no trainer to attach to: none of your processes has torch loaded or a GPU context")
    listing = _listing(found)
    if args.yes or not sys.stdin.isatty():
        raise CliError(f"attach needs a PID (stdin is not a terminal); candidates:\n{listing}")
    answer = _ask(
        f"your processes that look like trainers:\n{listing}\nattach to which [1-{len(found)}, Enter: none]? "
    )
    if not answer:
        raise CliError("nothing picked: not attached")
    if not answer.isdigit() or not 1 <= int(answer) <= len(found):
        raise CliError(f"{answer!r}: expected a number from 1 to {len(found)}")
    return found[int(answer) - 1].pid


def _ask_log(a: Adoptee) -> str | None:
    """Its stdout is a terminal (or a pipe): ask for the file it also writes, where one asks."""
    if not sys.stdin.isatty():
        return None
    return (
        _ask(
            f"pid {a.pid} writes to no file ({a.log_why})\n"
            "its log file (Enter: none; findings then come from the process alone): "
        )
        or None
    )


def _ask(prompt: str) -> str:
    """A question on stderr (stdout carries the run id alone, as `launch`'s does)."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    return input().strip()


def cmd_attach(args: argparse.Namespace) -> int:
    pid = args.pid if args.pid is not None else _pick(args)
    try:
        a = inspect(pid, gpu_pids=_gpu_pids)
    except AdoptRefused as exc:
        raise CliError(str(exc)) from None
    log = args.log if args.log is not None or a.log or a.was_run else _ask_log(a)
    opts: dict[str, Any] = {}
    for key in ("resume_template", "linger_s"):
        if getattr(args, key, None) is not None:
            opts[key] = getattr(args, key)
    info = attach(a, LaunchOptions(**opts), log=log, ckpt=args.ckpt, name=args.name)
    print(info.run_id)
    if a.was_run == info.run_id:
        print(
            f"took back pid {a.pid} of run {info.run_id} under a new keeper (its keeper was gone)",
            file=sys.stderr,
        )
        return 0
    said = [f"attached to pid {a.pid}" + (f" (torchrun agent of worker {a.agent_of})" if a.agent_of else "")]
    said.append(
        f"log: {log or a.log} ({'--log' if log else a.log_why})" if (log or a.log) else "no log: pass --log"
    )
    ckpt = args.ckpt or a.ckpt_dir
    said.append(
        f"checkpoints: {ckpt} ({'--ckpt' if args.ckpt else a.ckpt_from})"
        if ckpt
        else "checkpoints: none named: pass --ckpt"
    )
    print("; ".join(said), file=sys.stderr)
    return 0
