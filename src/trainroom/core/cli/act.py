"""The keeper's actions from the command line: kill, reclaim, resume, dump, bench. Each asks the
keeper for its plan, prints it, asks for confirmation (unless --yes; never for bench and dump),
then prints progress and the before -> after evidence. Exit 0 done, 1 refused or cancelled,
2 bad input."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainroom.core.cli.errors import CliError
from trainroom.core.cli.output import to_json
from trainroom.core.config import load_config
from trainroom.core.ops.bench import describe, run_bench
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.store import RunError


def _evidence(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def cmd_action(args: argparse.Namespace) -> int:
    """kill / reclaim / resume / dump / prune / verify-latest through the keeper, with a confirmation."""
    info = runs.resolve_run(args.run)
    if not info.alive:
        raise CliError(f"the keeper of {info.run_id} is gone; `trainroom launch` starts a new run")
    client = KeeperClient(info.sock)
    req_args: dict[str, Any] = {}
    for key in ("keep", "dry_run", "grace_s", "device", "seconds"):
        if getattr(args, key, None) is not None:
            req_args[key] = getattr(args, key)
    plan = client.call(args.action, req_args, confirm=False)
    if plan.stage == "done" and not plan.ok:
        return _print_reply(args, plan)
    if not args.json:
        print(plan.message)
        for k, v in plan.plan.items():
            print(f"  {k}: {v}")
    # Only what changes the run asks first; a bench or a stack dump does not.
    confirm = args.yes or args.action in ("bench", "dump")
    if not confirm:
        if not sys.stdin.isatty():
            raise CliError(f"{args.action} needs confirmation: pass --yes (stdin is not a terminal)")
        confirm = input(f"{args.action}? [y/N] ").strip().lower() in ("y", "yes")
        if not confirm:
            print("cancelled")
            return 1
    last = None
    # What runs is what was shown: the keeper refuses if the target changed meanwhile.
    for r in client.request(args.action, {**req_args, "expect": plan.plan}, confirm=True):
        last = r
        if r.stage == "progress" and not args.json:
            print(f"  … {r.message}")
    assert last is not None
    return _print_reply(args, last)


def cmd_bench(args: argparse.Namespace) -> int:
    """Through the run's keeper (on the trainer's device and interpreter) when one is up, else
    here: the bench needs no run, only torch."""
    if args.run:
        info = runs.resolve_run(args.run)
        if not info.alive:
            print(f"trainroom: the keeper of {info.run_id} is gone: benching here", file=sys.stderr)
            return bench_here(args)
    else:
        try:
            info = runs.resolve_run(None, live_only=True)
        except RunError:
            return bench_here(args)
    args.run = info.run_id
    return cmd_action(args)


def _print_reply(args: argparse.Namespace, r: Any) -> int:
    if args.json:
        print(
            to_json(
                {
                    "action": r.action,
                    "ok": r.ok,
                    "message": r.message,
                    "plan": r.plan,
                    "before": r.before,
                    "after": r.after,
                },
            )
        )
    else:
        print(("ok: " if r.ok else "refused: ") + r.message)
        if r.before:
            print(f"  before: {_evidence(r.before)}")
        if r.after:
            print(f"  after:  {_evidence(r.after)}")
    return 0 if r.ok else 1


def bench_here(args: argparse.Namespace) -> int:
    """Bench here, without a keeper (args: device, seconds, json), with the [bench] section of
    the trainroom.toml in force here (the current dir, then the state dir)."""
    cfg, _path = load_config(Path.cwd(), runs.state_dir())  # ConfigError: one line, exit 2
    seconds = getattr(args, "seconds", None) or cfg.bench.seconds
    result = run_bench(getattr(args, "device", "auto"), seconds=seconds, floor_tflops=cfg.bench.floor_tflops)
    print(to_json(result.as_dict()) if getattr(args, "json", False) else describe(result))
    return 0 if result.passed else 1
