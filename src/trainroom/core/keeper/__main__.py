"""`python -m trainroom.core.keeper RUN_DIR`: what `launch` (and `attach`) starts, detached, for one run."""

import asyncio
import signal
import sys
from pathlib import Path

from trainroom.core.keeper.loop import Keeper


def run_keeper(run_dir: str) -> int:
    # A foreground `launch` starts us with its checkpoint signal blocked (and ignored): cleared
    # here, so the trainer we start inherits no blocked signal (an ignored one stays ignored).
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    keeper = Keeper(Path(run_dir))
    return asyncio.run(keeper.main())


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m trainroom.core.keeper RUN_DIR", file=sys.stderr)
        return 2
    return run_keeper(args[0])


if __name__ == "__main__":
    sys.exit(main())
