"""The console script: the headless CLI of trainroom.core, with the control room plugged in.

The core never imports the TUI (a trainer imports the core into its own environment); this one
module knows both, and hands the core a way to open the control room.
"""

from __future__ import annotations

import argparse
import sys

from trainroom.core.cli import main as cli


def open_control_room(args: argparse.Namespace) -> int:
    # Imported here, not above: `trainroom status` and friends never pay for loading Textual.
    if getattr(args, "cmd", None) == "job":
        from trainroom.tui.job import run_job_app

        return run_job_app(args)
    from trainroom.tui.entry import run_app

    return run_app(args)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, open_tui=open_control_room)


if __name__ == "__main__":
    sys.exit(main())
