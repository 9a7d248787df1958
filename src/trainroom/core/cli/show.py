"""`trainroom status` and `trainroom runs`: what a run is doing, from its keeper or its journal."""

from __future__ import annotations

import argparse

from trainroom.core.cli.output import to_json
from trainroom.core.run import store as runs
from trainroom.core.run.client import current_state, read_run
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.run.store import RunError


def cmd_status(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    st, keeper = read_run(info)
    d = status_dict(st, keeper_alive=keeper != "gone")
    d["keeper"] = keeper
    if args.json:
        print(to_json(d))
    else:
        print("\n".join(status_lines(d)))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    rows = runs.list_runs()
    if args.json:
        out = []
        for r in rows:
            try:
                st, alive = current_state(r)
                out.append(
                    {
                        "run": r.run_id,
                        "alive": alive,
                        "state": status_dict(st, keeper_alive=alive)["state"],
                        "argv": r.argv,
                        "run_dir": r.run_dir,
                        "created": r.created,
                    }
                )
            except RunError as exc:
                out.append({"run": r.run_id, "alive": False, "state": None, "error": str(exc)})
        print(to_json(out))
        return 0
    if not rows:
        print(f"no runs under {runs.runs_dir()}")
        return 0
    for r in rows:
        try:
            st, alive = current_state(r)
            state = status_dict(st, keeper_alive=alive)["state"]
        except RunError:
            state = "?"
        print(
            f"{r.run_id:40} {state:9} {'keeper up' if r.alive else 'keeper gone':12} {' '.join(r.argv)[:60]}"
        )
    return 0
