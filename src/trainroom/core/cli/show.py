"""`trainroom status` and `trainroom runs`: what a run is doing, from its keeper or its journal."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.cli.errors import CliError
from trainroom.core.cli.output import to_json
from trainroom.core.journal import segments
from trainroom.core.probes.procs import process_state, state_name
from trainroom.core.run import expire
from trainroom.core.run import store as runs
from trainroom.core.run.client import keeper_stopped, read_run, read_summary
from trainroom.core.run.gone import keeper_gone, orphaned_trainer
from trainroom.core.run.state import RunState
from trainroom.core.run.status import status_dict
from trainroom.core.run.status_text import status_lines
from trainroom.core.run.store import RunError
from trainroom.core.units import fmt_bytes, fmt_duration


def keeper_gone_words(st: RunState, info: runs.RunInfo) -> tuple[str, str] | None:
    """The state word and the way on for a run whose keeper is gone (`run.gone`, which the
    control room's header reads too)."""
    said = keeper_gone(st, info)
    return (said.state, said.reason(time.time())) if said is not None else None


def not_answering(st: RunState, info: runs.RunInfo) -> tuple[str | None, str]:
    """For a keeper that lives but does not answer: the state its journal cannot know (the
    trainer ended since: "unknown") or None to keep the journal's, and why, from the facts this
    host gives: the keeper's /proc state, the trainer's pid and whether it still runs."""
    stopped = keeper_stopped(info)
    why = f"the keeper (pid {stopped}) is stopped" if stopped else "the keeper is not answering"
    a = st.attempt
    if a is None or a.ended_at is not None or a.pid <= 0:
        return None, f"{why}; its journal says the rest"
    if orphaned_trainer(st) is None:
        return "unknown", f"{why}; trainer pid {a.pid} is no longer running and its end is not recorded yet"
    return None, f"{why}; trainer pid {a.pid} is still running ({state_name(process_state(a.pid))})"


def cmd_status(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    st, keeper = read_run(info)
    # An action a finding names only where it would act (the control room's keys likewise).
    d = status_dict(st, keeper_alive=keeper != "gone")
    if any(f.action for f in st.open_findings()):
        # Which named action acts now needs the actions' own preconditions (their registry): only
        # loaded when a finding names one, so `status` in a loop of a healthy run stays cheap.
        from trainroom.core.actions.offered import offered_only

        d = offered_only(st, d, keeper_alive=keeper == "alive")
    d["keeper"] = keeper
    if keeper == "busy":
        state, d["state_reason"] = not_answering(st, info)
        d["state"] = state or d["state"]
    if keeper == "gone":
        said = keeper_gone_words(st, info)
        if said is not None:
            d["state"], d["state_reason"] = said
    d["journal"] = journal_dict(Path(info.run_dir))
    warning = runs.state_dir_warning()
    if warning is not None:
        d["warnings"] = [warning]
    if args.json:
        print(to_json(d))
    else:
        print("\n".join(status_lines(d)))
        if warning is not None:
            print(f"trainroom: warning: {warning}", file=sys.stderr)
    return 0


def journal_dict(run_dir: Path) -> dict[str, Any]:
    """What the run's journal takes on disk (stats only: no journal read)."""
    sealed = segments.sealed(run_dir)
    return {
        "bytes": segments.journal_bytes(run_dir),
        "segments": len(sealed) + 1,
        "lean_segments": sum(1 for s in sealed if s.lean),
    }


def _runs_rows() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in runs.list_runs():
        try:
            s, keeper, source = read_summary(r)
        except RunError as exc:
            out.append({"run": r.run_id, "alive": False, "state": None, "error": str(exc)})
            continue
        worst = s.worst
        out.append(
            {
                "run": r.run_id,
                "alive": keeper != "gone",
                # live: a trainer runs (a keeper staying after its trainer ended is not live)
                "training": keeper != "gone" and not s.attempt_ended,
                "state": s.shown_state(keeper_alive=keeper != "gone"),
                "argv": r.argv,
                "run_dir": r.run_dir,
                "created": r.created,
                "keeper": keeper,
                "attempt": s.attempt,
                "attached": s.attached,
                "step": s.step,
                "loss": s.loss,
                "steps_total": s.steps_total,
                "last_step_t": s.last_step_t,
                "ended_at": s.ended_at,
                "findings": s.findings,
                "worst_finding": (
                    {"code": worst.code, "severity": worst.severity, "message": worst.message}
                    if worst
                    else None
                ),
                "read_from": source,
            }
        )
    return out


def cmd_runs(args: argparse.Namespace) -> int:
    if args.prune_older_than is not None:
        return cmd_prune_runs(args)
    if args.yes or args.with_checkpoints:
        raise CliError("--yes and --with-checkpoints go with --prune-older-than DURATION")
    rows = _runs_rows()
    if args.json:
        print(to_json(rows))
        return 0
    if not rows:
        print(f"no runs under {runs.runs_dir()}")
        return 0
    for row in rows:
        state = row["state"] or "?"
        step = "" if row.get("step") is None else f"step {row['step']}"
        worst = (row.get("worst_finding") or {}).get("code", "")
        keeper = "training" if row.get("training") else "keeper up" if row["alive"] else "keeper gone"
        keeper = f"{keeper}, attached" if row.get("attached") else keeper
        print(
            f"{row['run']:40} {state:9} {keeper:20} {step:>12} {worst:18} {' '.join(row.get('argv') or [])[:40]}"
        )
    return 0


def cmd_prune_runs(args: argparse.Namespace) -> int:
    """`runs --prune-older-than DURATION`: the plan (a dry run) unless --yes."""
    plan = expire.plan(args.prune_older_than, with_checkpoints=args.with_checkpoints)
    result = expire.carry_out(plan) if args.yes else None
    if args.json:
        print(to_json({"plan": msgspec.to_builtins(plan), "result": msgspec.to_builtins(result)}))
        return 0
    cutoff = fmt_duration(plan.older_than_s)
    if not plan.prune and not plan.kept:
        print(f"no run unchanged for {cutoff} under {runs.runs_dir()}")
        return 0
    for row in plan.prune:
        ck = f", {row.checkpoint_files} checkpoint file(s) with it" if row.checkpoint_files else ""
        print(
            f"{'delete' if args.yes else 'would delete'} {row.run_id}: unchanged for {fmt_duration(row.age_s)}, "
            f"{fmt_bytes(row.bytes)}{ck}"
        )
    for row in plan.kept:
        print(f"keep {row.run_id}: {row.kept}")
    if result is None:
        print(
            f"dry run: nothing deleted; `--yes` deletes these {len(plan.prune)} run(s) ({fmt_bytes(plan.bytes_to_free)})"
        )
        return 0
    for run_id, why in result.skipped.items():
        print(f"spared {run_id}: {why}")
    print(f"deleted {len(result.deleted)} run(s), freed {fmt_bytes(result.freed_bytes)}")
    return 0
