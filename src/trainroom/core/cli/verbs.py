"""Every verb of the `trainroom` command, in the order `--help` lists them. A verb is a function
that adds its subparser (`sub.add_parser(...)`, its options, `set_defaults(func=...)`); it is
given the hook that opens the control room, which a few verbs end in.

Adding a verb: a module in this package with its `add_parser`, and one line in `VERBS`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from trainroom.core import argtypes
from trainroom.core.cli import (
    act,
    bridge,
    ckpt,
    doctor,
    evaluate,
    events,
    export,
    job,
    notify,
    replay,
    show,
    stopkeeper,
)
from trainroom.core.cli.launch import add_foreground_options, add_launch_options, cmd_launch
from trainroom.core.demo.launcher import add_demo_parser, run_demo

OpenTui = Callable[[argparse.Namespace], int]
Verb = Callable[[Any, OpenTui], None]


def _launch(sub: Any, open_tui: OpenTui) -> None:
    sp = sub.add_parser("launch", help="start a trainer detached, under a keeper; prints the run id")
    add_launch_options(sp)
    add_foreground_options(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    sp.set_defaults(func=cmd_launch)


def _status(sub: Any, open_tui: OpenTui) -> None:
    sp = sub.add_parser("status", help="the state of a run (default: the newest)")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=show.cmd_status)


def _runs(sub: Any, open_tui: OpenTui) -> None:
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


def _watch(sub: Any, open_tui: OpenTui) -> None:
    sp = sub.add_parser("watch", help="open the control room on a run")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--theme", dest="watch_theme")
    sp.set_defaults(func=open_tui)


def _demo(sub: Any, open_tui: OpenTui) -> None:
    add_demo_parser(sub, lambda args: run_demo(args, open_tui))


VERBS: tuple[Verb, ...] = (
    _launch,
    _status,
    _runs,
    _watch,
    _demo,
    lambda sub, _: events.add_parser(sub),
    lambda sub, _: notify.add_parser(sub),
    lambda sub, _: export.add_parser(sub),
    lambda sub, _: act.add_parsers(sub),  # the keeper's actions and `cancel`, from the registry
    lambda sub, _: ckpt.add_parser(sub),
    lambda sub, _: evaluate.add_parser(sub),
    lambda sub, _: replay.add_parser(sub),
    lambda sub, _: doctor.add_parser(sub),
    job.add_parser,
    lambda sub, _: bridge.add_parser(sub),
    lambda sub, _: stopkeeper.add_parser(sub),
)
