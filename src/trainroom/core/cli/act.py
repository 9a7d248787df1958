"""The keeper's actions from the command line, one verb each from the action registry (its help,
its options, whether it asks first), and `cancel` for the cancellable ones. Each asks the keeper
for its plan, prints it, asks for confirmation when the action changes the world (unless --yes),
then prints progress and the before -> after evidence. Exit 0 done, 1 refused or cancelled,
2 bad input."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from trainroom.core.actions import options, render, words
from trainroom.core.actions.registry import CANCELLABLE, REGISTRY
from trainroom.core.cli.errors import CliError
from trainroom.core.cli.output import to_json
from trainroom.core.configuration.config import load_config
from trainroom.core.journal.file import Journal
from trainroom.core.ops.bench import describe, run_bench
from trainroom.core.ops.kill import execute_kill, plan_kill
from trainroom.core.run import store as runs
from trainroom.core.run.attach import take_up
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.gone import orphaned_trainer
from trainroom.core.run.store import RunError
from trainroom.core.wire import protocol as p


def add_parsers(sub: Any) -> None:
    """A verb for each action the registry serves through the CLI, then `cancel`."""
    for name, action in REGISTRY.items():
        if not action.spec.cli_verb:
            continue
        sp = sub.add_parser(name, help=action.spec.description)
        sp.add_argument("run", nargs="?")
        sp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        sp.add_argument("--json", action="store_true")
        options.add_options(sp, action.Args)  # its flags, types and help: the action's Args
        sp.set_defaults(func=HERE.get(name, cmd_action), action=name)
    sp = sub.add_parser("cancel", help=f"cancel a long action in progress ({', '.join(CANCELLABLE)})")
    sp.add_argument("cancel_action", metavar="ACTION", choices=CANCELLABLE)
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_cancel, action="cancel")


def cmd_action(args: argparse.Namespace) -> int:
    """kill / reclaim / resume / dump / prune / verify-latest through the keeper, with a confirmation."""
    info = runs.resolve_run(args.run)
    if not info.alive:
        if args.action == "kill" and getattr(args, "finding", None):
            raise CliError(
                f"the keeper of {info.run_id} is gone: a finding's kill needs the keeper that raised it"
            )
        if args.action == "kill":
            return kill_without_keeper(info, args)
        if REGISTRY[args.action].spec.needs_keeper:
            raise CliError(f"the keeper of {info.run_id} is gone; `trainroom launch` starts a new run")
        info = keeper_for_resume(info, json_out=args.json)
    client = KeeperClient(info.sock)
    action = REGISTRY[args.action]
    req_args = options.given(action.Args, args)
    plan = client.call(args.action, req_args, confirm=False)
    if plan.stage == "done" and not plan.ok:
        return _print_reply(args, plan)
    if not args.json:
        print(plan.message)
        print("\n".join(render.plan_lines(args.action, plan.plan)))
    # Only what changes the run asks first; a bench or a stack dump does not.
    if action.spec.destructive and not _confirm(args):
        print("cancelled")
        return 1
    last = None
    # What runs is what was shown: the keeper refuses if the target changed meanwhile.
    for r in client.request(args.action, p.confirming(req_args, plan.plan), confirm=True):
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
        print(verdict(r.action, r.ok, r.message, r.after))
        if r.before:
            print(f"  before: {words.evidence(r.before)}")
        if r.after and words.evidence(r.after):
            print(f"  after:  {words.evidence(r.after)}")
        for heading, text in words.blocks(r.after):
            print(f"\n{heading}:\n{text.rstrip()}")
    # The same exit code with or without a keeper: a bench below its floor is 1 either way.
    act = REGISTRY.get(r.action)
    passed = act.passed(r.ok, r.after) if act is not None else r.ok
    return 0 if passed else 1


def verdict(action: str, ok: bool, message: str, after: dict[str, Any]) -> str:
    """One verdict a line (actions/words.py: the control room's result says the same)."""
    return words.verdict(action, ok, message, after)


def bench_here(args: argparse.Namespace) -> int:
    """Bench here, without a keeper (args: device, seconds, json), with the [bench] section of
    the trainroom.toml in force here (the current dir, then the state dir)."""
    cfg, _path = load_config(Path.cwd(), runs.state_dir())  # ConfigError: one line, exit 2
    seconds = getattr(args, "seconds", None) or cfg.bench.seconds
    result = run_bench(getattr(args, "device", "auto"), seconds=seconds, floor_tflops=cfg.bench.floor_tflops)
    print(to_json(result.as_dict()) if getattr(args, "json", False) else describe(result))
    return 0 if result.passed else 1


# A verb that also works here when the run has no live keeper.
HERE = {"bench": cmd_bench}


def cmd_cancel(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    if not info.alive:
        raise CliError(f"the keeper of {info.run_id} is gone: nothing of it is running")
    reply = KeeperClient(info.sock).call("cancel", {"action": args.cancel_action})
    return _print_reply(args, reply)


def _confirm(args: argparse.Namespace) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{args.action} needs confirmation: pass --yes (stdin is not a terminal)")
    return input(f"{args.action}? [y/N] ").strip().lower() in ("y", "yes")


def keeper_for_resume(info: runs.RunInfo, *, json_out: bool) -> runs.RunInfo:
    """`resume` of a run whose keeper is gone: a new keeper takes the run up (same run id, its
    journal), and the resume goes through it as the next attempt; refused while the old
    attempt's trainer still runs (an orphan), naming the two ways on."""
    st = runs.load_state(info.run_dir)
    a = st.attempt
    orphan = orphaned_trainer(st)
    if a is not None and orphan is not None:
        raise CliError(
            f"attempt {a.n} (pid {orphan}) still runs without its keeper: `trainroom kill {info.run_id}` ends it "
            f"(then resume), or `trainroom attach {orphan}` takes it back under a new keeper"
        )
    if not json_out:
        print(f"the keeper of {info.run_id} is gone: a new keeper takes the run up (same run, next attempt)")
    return take_up(info)


def kill_without_keeper(info: runs.RunInfo, args: argparse.Namespace) -> int:
    """The keeper is gone but its trainer may live on (orphaned): kill the recorded attempt's
    group here, with the keeper's own proof of ownership (the run's id in each process's
    environment, started within the attempt), and journal it as the keeper would have."""
    st = runs.load_state(info.run_dir)
    a = st.attempt
    if a is None or a.pid <= 0:
        raise CliError(f"{info.run_id} has no attempt with a process group to kill")
    plan = plan_kill(
        a.pid,
        a.pgid,
        a.start_time,
        attempt_start_ticks=a.start_ticks,
        run_id=st.run_id,
        attempt_ended_at=a.ended_at,
        workers=st.attempt_workers(),
        attached=a.attached,
    )
    pids = [m.pid for m in plan.members]
    if not plan.ok:
        print(
            f"refused: {'; '.join(plan.refusals)}"
            if not args.json
            else to_json({"ok": False, "refusals": plan.refusals})
        )
        return 1
    if not args.json:
        print(
            f"the keeper of {info.run_id} is gone; attempt {a.n} still has {len(pids)} process(es), "
            f"pids {', '.join(map(str, pids))}"
        )
        for m in plan.members:
            print(f"  pid {m.pid}  {' '.join(m.cmdline)[:80]}")
    if not _confirm(args):
        print("cancelled")
        return 1
    by = "cli (no keeper)"
    until = time.time() + float(args.grace_s if args.grace_s is not None else 10.0) + 10.0
    result = execute_kill(plan, grace_s=float(args.grace_s if args.grace_s is not None else 10.0))
    ended: list[p.Record] = [p.AttemptStopping(n=a.n, t=time.time(), by=by, until=until)] if result.ok else []
    if result.ok and a.ended_at is None:
        # Its end, as a keeper would have journaled it: readers and the next keeper agree it is over.
        how = "killed by `trainroom kill` while no keeper watched it (exit status unknown)"
        ended += [
            p.AttemptEnded(n=a.n, t=time.time(), error=how),
            p.RunStatus(t=time.time(), state="stopped", reason=f"attempt {a.n} stopped by {by}: {how}"),
        ]
    _journal_kill(info, plan.as_dict(), result.as_dict(), ended)
    if args.json:
        print(to_json(result.as_dict()))
    else:
        print(verdict("kill", result.ok, result.message, {}) + " (without a keeper: journaled here)")
    return 0 if result.ok else 1


def _journal_kill(
    info: runs.RunInfo, target: dict[str, Any], result: dict[str, Any], ended: list[p.Record]
) -> None:
    """The kill goes into the run's journal, as the keeper would have written it (the keeper is
    gone, so this is the only writer)."""
    journal = Journal(Path(info.run_dir) / runs.JOURNAL_NAME)
    try:
        journal.append(
            p.ActionRecord(
                action="kill",
                t=time.time(),
                ok=bool(result.get("ok")),
                message=str(result.get("message", "")) + " (the keeper was gone: done by the CLI)",
                target=target,
                before=result.get("before") or {},
                after=result.get("after") or {},
                client="cli-without-keeper",
            )
        )
        for rec in ended:
            journal.append(rec)
    finally:
        journal.close()
