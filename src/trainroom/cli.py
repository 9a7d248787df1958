"""The console script: the headless CLI of trainroom.core, with the control room plugged in.

The core never imports the TUI (a trainer imports the core into its own environment); this one
module knows both, and hands the core a way to open the control room.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Iterator

from trainroom.core.cli import main as cli


def open_control_room(args: argparse.Namespace) -> int:
    # Imported here, not above: `trainroom status` and friends never pay for loading Textual.
    with loading_quietly():
        if getattr(args, "cmd", None) == "job":
            from trainroom.tui.job import run_job_app as run
        else:
            from trainroom.tui.entry import run_app as run
    return run(args)


@contextlib.contextmanager
def loading_quietly() -> Iterator[None]:
    """No garbage collection while the control room's ~500 modules load (what they make is
    nothing to collect: classes, functions, tables), then those objects frozen out of every
    later collection: in a headless start, about 8 % less CPU to the first frame with the run's
    state (docs/benchmarks.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, open_tui=open_control_room)


if __name__ == "__main__":
    sys.exit(main())
