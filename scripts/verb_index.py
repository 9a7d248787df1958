"""The verb index `trainroom --help` lists without importing a verb (src/trainroom/core/cli/verbindex.py),
rendered from `verbs.VERBS` by loading every verb once.

    python scripts/verb_index.py            # print it
    python scripts/verb_index.py --write    # update verbindex.py (then ruff-formats it)

Run it after adding, renaming or re-describing a verb (or an action: its CLI verb); the unit test
tests/unit/test_cli_lazy.py fails while the index is stale.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from trainroom.core.cli.subcommands import full_index, render_index

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "src" / "trainroom" / "core" / "cli" / "verbindex.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--write", action="store_true", help=f"update {INDEX.relative_to(ROOT)} in place")
    args = ap.parse_args(argv)
    text = render_index(full_index())
    if not args.write:
        sys.stdout.write(text)
        return 0
    INDEX.write_text(text)
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(INDEX)], check=True)
    print(f"{INDEX.relative_to(ROOT)}: written ({len(full_index())} verbs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
