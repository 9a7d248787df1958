"""The `trainroom` command. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from trainroom.core.cli import remote
from trainroom.core.cli.errors import EXIT_BAD_INPUT, CliError
from trainroom.core.cli.subcommands import LazySubcommands
from trainroom.core.cli.verbindex import INDEX
from trainroom.core.cli.verbs import VERBS, OpenTui

# The errors that are the user's input or the world's state, said in one line: where each lives.
# Looked up among the modules this command has imported (an error of a module never imported
# cannot have been raised), so a verb pays only for its own imports.
ONE_LINE_ERRORS = (
    ("trainroom.core.run.store", "RunError"),
    ("trainroom.core.run.client", "KeeperGone"),
    ("trainroom.core.configuration.sections", "ConfigError"),
    ("trainroom.core.remote.ssh", "Unreachable"),
    ("trainroom.core.remote.ssh", "RemoteRefused"),
)

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


def top_parser() -> argparse.ArgumentParser:
    """`trainroom` and its own options, before any verb."""
    ap = Parser(prog="trainroom", description=__doc__)
    ap.add_argument(
        "--theme",
        help="control room theme: dark (default), light, contrast, or one of yours in $TRAINROOM_HOME/themes",
    )
    return ap


def build_parser() -> argparse.ArgumentParser:
    """Every verb, each loaded when argparse looks it up (`subcommands`)."""
    ap = top_parser()
    sub = ap.add_subparsers(dest="cmd", action=LazySubcommands)
    assert isinstance(sub, LazySubcommands)
    sub.offer(VERBS, INDEX, open_tui)
    return ap


def _one_line(exc: BaseException) -> bool:
    if isinstance(exc, CliError):
        return True
    for module, name in ONE_LINE_ERRORS:
        imported = sys.modules.get(module)
        if imported is not None and isinstance(exc, getattr(imported, name)):
            return True
    return False


def pin_home() -> None:
    """A relative TRAINROOM_HOME means the caller's cwd, for every process it starts (the run store
    resolves it; one already absolute and normal, or none, costs no import here)."""
    home = os.environ.get("TRAINROOM_HOME")
    if home and not (os.path.isabs(home) and os.path.normpath(home) == home):
        from trainroom.core.run import store

        store.pin_home()


def main(argv: list[str] | None = None, open_tui: OpenTui | None = None) -> int:
    global _open_tui
    if open_tui is not None:
        _open_tui = open_tui
    pin_home()
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
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if _one_line(exc):
            print(f"trainroom: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not isinstance(exc, OSError):
            raise
        # A file or socket the command could not use (a permission, a full disk): one line.
        where = f": {exc.filename}" if exc.filename else ""
        print(f"trainroom: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
