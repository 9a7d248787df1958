"""Commands on a run of another host (`ssh://[user@]host[:port][/RUN]`), decided in one place.

While the remote keeper lives, the keeper's verbs (status, watch, kill, reclaim, resume, dump,
continue, cancel, bench) run here as for a local run, their `KeeperClient` dialing the keeper
through `ssh HOST trainroom bridge RUN`. Whatever works on that host's files (verify, prune,
events, notify, and every verb once the keeper is gone: an orphan's kill, a journal's status) is
run there: `ssh HOST trainroom VERB RUN ...`, with this terminal's stdio (a tty when this is one,
so a confirmation prompt works).
"""

from __future__ import annotations

import argparse
import sys

from trainroom.core.cli.errors import CliError
from trainroom.core.run.address import SCHEME, is_remote

# The verbs of the CLI's own that ask the run's keeper; each action says whether its verb does
# (`ActionSpec.through_bridge`), read only for a remote run (the registry imports every action).
KEEPER_VERBS = frozenset({"status", "watch", "cancel"})


def through_bridge(cmd: str) -> bool:
    """Whether verb `cmd` asks the run's keeper (so the bridge carries it while the keeper lives)."""
    if cmd in KEEPER_VERBS:
        return True
    from trainroom.core.actions.registry import REGISTRY

    act = REGISTRY.get(cmd)
    return act is not None and act.spec.through_bridge


def as_watch(argv: list[str]) -> list[str]:
    """`trainroom ssh://host/RUN` opens the control room on that run, as `trainroom RUN` would."""
    return ["watch", *argv] if argv and argv[0].startswith(SCHEME) else argv


def route(args: argparse.Namespace, argv: list[str]) -> int | None:
    """None: run the command here (a local run, or a remote one whose keeper the bridge reaches);
    else the exit code of the command run on the run's host."""
    from trainroom.core.remote import reach

    reach.install()  # the command line reaches runs on other hosts over ssh (imports ssh when one comes)
    spec = getattr(args, "run", None)
    if not is_remote(spec) or args.cmd == "bridge":
        return None
    from trainroom.core.remote import ssh
    from trainroom.core.remote.target import TargetError, resolve_target
    from trainroom.core.run import store

    assert spec is not None
    run: str | None = None
    if through_bridge(args.cmd):
        info = store.remote_run(spec)
        if info.alive or args.cmd == "watch":
            return None  # the control room shows a gone keeper's journal itself
        run = info.run_id
    try:
        target = resolve_target(spec)
    except TargetError as exc:
        raise CliError(str(exc)) from None
    run = run or target.run
    remote_argv = [a for w in argv for a in ((run,) if w == spec else (w,)) if a is not None]
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    rc = ssh.run_remote(target, remote_argv, tty=tty)
    if rc == ssh.EXIT_SSH_FAILED:
        raise CliError(f"{target.node} unreachable (ssh exit {rc}; its words are above)")
    return rc
