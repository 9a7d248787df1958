"""`trainroom status` and `trainroom runs`: what a run is doing, from its keeper or its journal."""

from __future__ import annotations

import argparse

from trainroom.core.cli.output import to_json
from trainroom.core.probes.procs import same_start
from trainroom.core.run import store as runs
from trainroom.core.run.client import current_state, read_run
from trainroom.core.run.state import RunState
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.run.store import RunError


def orphaned_trainer(st: RunState) -> int | None:
    """The pid of a trainer that outlived its keeper: the journal's attempt has no end, and its
    process (by pid and start tick) still runs."""
    a = st.attempt
    if a is None or a.ended_at is not None or a.pid <= 0:
        return None
    return a.pid if same_start(a.pid, a.start_time, a.start_ticks) else None


def cmd_status(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    st, keeper = read_run(info)
    d = status_dict(st, keeper_alive=keeper != "gone")
    d["keeper"] = keeper
    orphan = orphaned_trainer(st) if keeper == "gone" else None
    if orphan is not None:
        d["state"] = "orphaned"
        d["state_reason"] = (
            f"keeper gone; trainer pid {orphan} still running (orphaned): `trainroom kill {st.run_id}` ends it"
        )
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
