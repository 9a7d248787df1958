"""The `trainroom` command. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from trainroom.core.cli import remote
from trainroom.core.cli.errors import EXIT_BAD_INPUT, CliError
from trainroom.core.cli.verbs import VERBS, OpenTui
from trainroom.core.remote.ssh import RemoteRefused, Unreachable
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperGone
from trainroom.core.run.store import RunError
from trainroom.core.sections import ConfigError

_open_tui: OpenTui | None = None


def open_tui(args: argparse.Namespace) -> int:
    """Open the control room through the hook the console script installed (the core itself
    never imports the TUI)."""
    if _open_tui is None:
        raise CliError("the control room is not available from here: run the `trainroom` command")
    return _open_tui(args)


def cmd_watch(args: argparse.Namespace) -> int:
    return open_tui(args)


# ---------------------------------------------------------------------------- parser


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (which flag, why) and exit 2, not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trainroom", description=__doc__)
    ap.add_argument(
        "--theme",
        help="control room theme: dark (default), light, contrast, or one of yours in $TRAINROOM_HOME/themes",
    )
    sub = ap.add_subparsers(dest="cmd")
    for verb in VERBS:
        verb(sub, open_tui)
    return ap


def main(argv: list[str] | None = None, open_tui: OpenTui | None = None) -> int:
    global _open_tui
    if open_tui is not None:
        _open_tui = open_tui
    runs.pin_home()  # a relative TRAINROOM_HOME means the caller's cwd, for every process it starts
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
