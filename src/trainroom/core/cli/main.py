"""The `trainroom` command. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from trainroom.core import argtypes
from trainroom.core.cli import act, bridge, ckpt, doctor, events, export, job, notify, remote, show
from trainroom.core.cli.errors import EXIT_BAD_INPUT, CliError
from trainroom.core.cli.launch import add_launch_options, cmd_launch
from trainroom.core.demo.launcher import add_demo_parser, run_demo
from trainroom.core.ops.bench import add_device_options
from trainroom.core.remote.ssh import RemoteRefused, Unreachable
from trainroom.core.run.client import KeeperGone
from trainroom.core.run.store import RunError
from trainroom.core.sections import ConfigError

OpenTui = Callable[[argparse.Namespace], int]
_open_tui: OpenTui | None = None


def open_tui(args: argparse.Namespace) -> int:
    """Open the control room through the hook the console script installed (the core itself
    never imports the TUI)."""
    if _open_tui is None:
        raise CliError("the control room is not available from here: run the `trainroom` command")
    return _open_tui(args)


def cmd_watch(args: argparse.Namespace) -> int:
    return open_tui(args)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(args, open_tui)


# ---------------------------------------------------------------------------- parser


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (which flag, why) and exit 2, not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trainroom", description=__doc__)
    ap.add_argument("--theme", help="control room theme (dark, light, high-contrast, ...)")
    sub = ap.add_subparsers(dest="cmd")

    sp = sub.add_parser("launch", help="start a trainer detached, under a keeper; prints the run id")
    add_launch_options(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("status", help="the state of a run (default: the newest)")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=show.cmd_status)

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

    sp = sub.add_parser("watch", help="open the control room on a run")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--theme", dest="watch_theme")
    sp.set_defaults(func=cmd_watch)

    add_demo_parser(sub, cmd_demo)
    events.add_parser(sub)
    notify.add_parser(sub)
    export.add_parser(sub)

    for action, text in (
        ("kill", "kill the trainer's process group (SIGTERM, grace, SIGKILL)"),
        ("reclaim", "drop the page cache the way this host allows"),
        ("resume", "start a new attempt from the last verified checkpoint"),
        ("dump", "dump the trainer's stacks"),
        ("continue", "continue the trainer's stopped processes (SIGCONT)"),
        ("bench", "matmul TFLOPS on the run's device (here, with no live keeper)"),
    ):
        sp = sub.add_parser(action, help=text)
        sp.add_argument("run", nargs="?")
        sp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        sp.add_argument("--json", action="store_true")
        if action == "kill":
            sp.add_argument(
                "--grace",
                dest="grace_s",
                type=argtypes.seconds(0, 3600),
                help="seconds between SIGTERM and SIGKILL (default: [kill] grace_s, else 10)",
            )
            sp.add_argument(
                "--finding",
                metavar="IDENT",
                help="kill what this open finding targets (its ident in `status --json`, e.g. "
                "DUPLICATE_TRAINER:trainer), not the trainer",
            )
        if action == "bench":
            add_device_options(sp)
            sp.set_defaults(func=act.cmd_bench, action=action)
            continue
        sp.set_defaults(func=act.cmd_action, action=action)

    sp = sub.add_parser(
        "cancel", help="cancel a long action in progress (bench, verify, dump, a waiting resume)"
    )
    sp.add_argument("cancel_action", metavar="ACTION", choices=("bench", "verify", "dump", "resume"))
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=act.cmd_cancel, action="cancel")

    _add_module_verbs(sub)
    return ap


def _add_module_verbs(sub: Any) -> None:
    """Verbs whose code lives in a module of its own (verify, prune, doctor)."""
    ckpt.add_parser(sub)
    doctor.add_parser(sub)
    job.add_parser(sub, open_tui)
    bridge.add_parser(sub)


def main(argv: list[str] | None = None, open_tui: OpenTui | None = None) -> int:
    global _open_tui
    if open_tui is not None:
        _open_tui = open_tui
    ap = build_parser()
    argv = remote.as_watch(list(sys.argv[1:] if argv is None else argv))
    args = ap.parse_args(argv)
    try:
        forwarded = remote.route(args, argv)
        if forwarded is not None:
            return forwarded
        if args.cmd is None:
            args.run = None
            args.watch_theme = None
            return cmd_watch(args)
        return int(args.func(args) or 0)
    except (CliError, RunError, KeeperGone, ConfigError, Unreachable, RemoteRefused) as exc:
        print(f"trainroom: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        # A file or socket the command could not use (a permission, a full disk): one line.
        where = f": {exc.filename}" if exc.filename else ""
        print(f"trainroom: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
