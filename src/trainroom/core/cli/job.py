"""`trainroom job [TARGET ...]`: the keepers of one job, merged (see core/job).

TARGETs: `ssh://[user@]host[:port][/RUN]`, a `[hosts]` name from trainroom.toml, or a local run.
None: this host's run of the job (the newest job here, or `--job NAME`) and every host
trainroom.toml names. A remote target that names no run shows that host's newest run of the job.
Exit 0 when the job is running (or exited), 1 when it is not (dead, hung, stalled, unreachable, a
refused action), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from trainroom.core.cli.errors import CliError
from trainroom.core.cli.output import to_json
from trainroom.core.configuration import argtypes
from trainroom.core.job import actions
from trainroom.core.job.actions import stacks_lines  # its home before; still importable here
from trainroom.core.job.nodes import job_name, node_refs, read_nodes
from trainroom.core.job.view import job_dict
from trainroom.core.units import fmt_clock, fmt_duration
from trainroom.core.vocab import ActionName, NodeState

HEALTHY: frozenset[NodeState] = frozenset({"running", "starting", "slow", "exited"})


def add_parser(sub: Any, open_tui: Callable[[argparse.Namespace], int]) -> None:
    sp = sub.add_parser("job", help="the keepers of one multi-node job, merged (local and ssh://)")
    sp.add_argument(
        "targets", nargs="*", metavar="TARGET", help="ssh://[user@]host[:port][/RUN], a [hosts] name, a run"
    )
    sp.add_argument("--job", dest="job_name", metavar="NAME", help="the job (default: the newest here)")
    sp.add_argument(
        "--slurm",
        action="store_true",
        help="my newest Slurm job (as `slurm:JOBID`: its nodes from scontrol, each read through srun)",
    )
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--tui", action="store_true", help="open the control room's job screen")
    what = sp.add_mutually_exclusive_group()
    what.add_argument("--kill", action="store_true", help="kill every node's trainer (each as `kill` does)")
    what.add_argument("--resume", action="store_true", help="resume every node from the same verified step")
    what.add_argument("--stacks", action="store_true", help="dump every rank's stacks and compare them")
    sp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    sp.add_argument(
        "--grace", dest="grace_s", type=argtypes.seconds(0, 3600), help="kill: SIGTERM to SIGKILL"
    )
    sp.set_defaults(func=partial(cmd_job, open_tui=open_tui))


def cmd_job(args: argparse.Namespace, open_tui: Callable[[argparse.Namespace], int]) -> int:
    slurm_id = _slurm_id(args)
    if slurm_id is not None:
        from trainroom.core.cli.slurmjob import cmd_slurm_job

        return cmd_slurm_job(args, slurm_id, job_lines, HEALTHY, open_tui)
    if args.tui:
        return open_tui(args)
    refs = node_refs(list(args.targets))
    name = job_name(refs, args.job_name)
    readings = read_nodes(refs, name)
    if args.kill or args.resume:
        return _act("kill" if args.kill else "resume", args, refs, readings)
    if args.stacks:
        report = actions.dump_ranks(refs, readings)
        print(to_json(report) if args.json else "\n".join(stacks_lines(report)))
        return 0 if not report["not_arrived"] else 1
    d = job_dict(name, readings, time.time())
    print(to_json(d) if args.json else "\n".join(job_lines(d, time.time())))
    return 0 if d["state"] in HEALTHY else 1


def _slurm_id(args: argparse.Namespace) -> str | None:
    """The Slurm job asked for: `slurm:JOBID` (one target), or --slurm (my newest)."""
    given = [t for t in args.targets if t.startswith("slurm:")]
    if given and len(args.targets) > 1:
        raise CliError("slurm:JOBID is the whole job: give no other target with it")
    if given:
        return str(given[0]).removeprefix("slurm:")
    if getattr(args, "slurm", False):
        from trainroom.core.cli.slurmjob import newest_slurm_job

        return newest_slurm_job()
    return None


def _act(action: ActionName, args: argparse.Namespace, refs: list[Any], readings: list[Any]) -> int:
    req: dict[str, Any] = {"grace_s": args.grace_s} if action == "kill" and args.grace_s is not None else {}
    job = actions.plan(action, refs, readings, req)
    if not args.json:
        for na in job.nodes:
            word = na.error or (na.plan.message if na.plan is not None else "")
            print(f"node {na.node_rank if na.node_rank is not None else '?'} {na.node}: {word}")
    if job.refusal is not None or any(na.error for na in job.nodes):
        if job.refusal is None:
            job.refusal = f"{action} refused: not every node can {action} (above)"
        print(to_json(job.as_dict()) if args.json else job.refusal)
        return 1
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError(f"job {action} needs confirmation: pass --yes (stdin is not a terminal)")
        if input(f"{action} the job on {len(job.nodes)} node(s)? [y/N] ").strip().lower() not in ("y", "yes"):
            print("cancelled")
            return 1
    actions.carry_out(job, req)
    if args.json:
        print(to_json(job.as_dict()))
    else:
        for na in job.nodes:
            print(
                f"node {na.node_rank if na.node_rank is not None else '?'} {na.node}: {'ok' if na.ok else 'refused'}: {na.as_dict()['message']}"
            )
    return 0 if job.ok else 1


def job_lines(d: dict[str, Any], now: float) -> list[str]:
    out = [
        f"job {d['job'] or '?'}  {d['state'].upper()}  step {d['step'] if d['step'] is not None else '?'} (median)"
    ]
    rc = d["root_cause"]
    if rc is not None:
        out.append(f"first failure: {rc['message']}")
    for n in d["nodes"]:
        node = f"node {n['node_rank']}" if n["node_rank"] is not None else "node ?"
        line = f"{node:8} {n['state']:11} {n['host'] or '?':16} {n['run'] or '?':34} {n['target']}"
        out.append(line)
        if not n["reachable"]:
            out.append(f"         {n['link']}")
    out += [_rank_line(r) for r in d["ranks"]]
    out += [
        f"  {f['severity'][:4].upper()} {f['code']} (node {f['node_rank']}, {f['host']}): {f['message']}"
        for f in d["findings"]
    ]
    if d["hang"] is not None:
        out.append(f"hang: {d['hang']['summary']}")
    out.append(f"(as of {fmt_clock(now)})")
    return out


def _rank_line(r: dict[str, Any]) -> str:
    hb = f"heartbeat {fmt_duration(r['heartbeat_age_s'])} ago" if r["heartbeat_age_s"] is not None else ""
    node = r["node_rank"] if r["node_rank"] is not None else "?"
    step = r["step"] if r["step"] is not None else "?"
    return (
        f"  rank {r['rank']:<3} node {node:<3} pid {r['pid'] or '?':<8} {r['state']:12} step {step:<8} {hb}"
    )
