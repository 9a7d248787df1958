"""Every verb of the `trainroom` command, in the order `--help` lists them. A verb is a function
that adds its subparser (`sub.add_parser(...)`, its options, `set_defaults(func=...)`), named here
by `module:function` and imported only when its verb runs (or for `trainroom VERB --help`): a
`status` never loads the control room, the actions, the exporter or NVML. `tui=True`: the function
is also given the hook that opens the control room, which a few verbs end in.

Adding a verb: a module in this package with its `add_parser(sub)`, one line in `VERBS`, then
`python scripts/verb_index.py --write` (the names and help lines `--help` lists without importing
any verb: `verbindex.py`; tests/unit/test_cli_lazy.py says when it is stale)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OpenTui = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Verb:
    where: str  # "module:function", the function that adds the verb's subparser(s)
    tui: bool = False  # the function takes (sub, open_tui)


VERBS: tuple[Verb, ...] = (
    Verb("trainroom.core.cli.verbs:add_launch"),
    Verb("trainroom.core.cli.verbs:add_status"),
    Verb("trainroom.core.cli.verbs:add_runs"),
    Verb("trainroom.core.cli.verbs:add_watch", tui=True),
    Verb("trainroom.core.cli.verbs:add_demo", tui=True),
    Verb("trainroom.core.cli.attach:add_parser"),
    Verb("trainroom.core.cli.events:add_parser"),
    Verb("trainroom.core.cli.notify:add_parser"),
    Verb("trainroom.core.cli.export:add_parser"),
    Verb("trainroom.core.cli.act:add_parsers"),  # the keeper's actions and `cancel`, from the registry
    Verb("trainroom.core.cli.ckpt:add_parser"),
    Verb("trainroom.core.cli.evaluate:add_parser"),
    Verb("trainroom.core.cli.replay:add_parser"),
    Verb("trainroom.core.cli.doctor:add_parser"),
    Verb("trainroom.core.cli.job:add_parser", tui=True),
    Verb("trainroom.core.cli.bridge:add_parser"),
    Verb("trainroom.core.cli.stopkeeper:add_parser"),
)


def add_launch(sub: Any) -> None:
    from trainroom.core.cli.launch import add_foreground_options, add_launch_options, cmd_launch

    sp = sub.add_parser("launch", help="start a trainer detached, under a keeper; prints the run id")
    add_launch_options(sp)
    add_foreground_options(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    sp.set_defaults(func=cmd_launch)


def add_status(sub: Any) -> None:
    from trainroom.core.cli import show

    sp = sub.add_parser("status", help="the state of a run (default: the newest)")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=show.cmd_status)


def add_runs(sub: Any) -> None:
    from trainroom.core.cli import show
    from trainroom.core.configuration import argtypes

    sp = sub.add_parser("runs", help="list runs (or let old ones go: --prune-older-than)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument(
        "--prune-older-than",
        metavar="DURATION",
        type=argtypes.duration,
        help="runs unchanged for this long (12h, 30d, 2w): a plan of what would go; never a live run",
    )
    sp.add_argument("--yes", action="store_true", help="with --prune-older-than: delete what the plan lists")
    sp.add_argument(
        "--with-checkpoints",
        action="store_true",
        help="with --prune-older-than: also runs that hold checkpoints in their own directory",
    )
    sp.set_defaults(func=show.cmd_runs)


def add_watch(sub: Any, open_tui: OpenTui) -> None:
    sp = sub.add_parser("watch", help="open the control room on a run")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--theme", dest="watch_theme")
    sp.set_defaults(func=open_tui)


def add_demo(sub: Any, open_tui: OpenTui) -> None:
    from trainroom.core.demo.launcher import add_demo_parser, run_demo

    add_demo_parser(sub, lambda args: run_demo(args, open_tui))
