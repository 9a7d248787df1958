"""The console script: the headless CLI of trainroom.core, with the control room plugged in.

The core never imports the TUI (a trainer imports the core into its own environment); this one
module knows both, and hands the core a way to open the control room.
"""

from __future__ import annotations

import argparse
import sys


def open_control_room(args: argparse.Namespace) -> int:
    from trainroom.tui.app import run_app

    return int(run_app(args) or 0)


def main(argv: list[str] | None = None) -> int:
    from trainroom.core.cli import main as cli

    return cli.main(argv, open_tui=open_control_room)


if __name__ == "__main__":
    sys.exit(main())
