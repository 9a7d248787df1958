"""`trainroom eval [RUN] [--step N] [--json]`: run a run's own evaluation ([eval] in its
trainroom.toml, or `launch --eval-command`) again on a promoted checkpoint and compare the figure
with the one recorded when it was promoted: the same to the 4th decimal, or it is not deterministic
(dropout left on, a shuffled eval set, nondeterministic kernels) and a regression it judged may be
noise. Exit 0 reproduces, 1 does not, 2 bad input (no evaluation set, no evaluated checkpoint)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.cli.errors import CliError
from trainroom.core.configuration.config import Eval, load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.configuration.settings import eval_policy
from trainroom.core.ops.evaluate import evaluate
from trainroom.core.run import store as runs
from trainroom.core.run.parts import CheckpointView
from trainroom.core.units import to_json
from trainroom.core.wire import protocol as p

# Two figures agree when they round to the same 4th decimal (half a unit of it apart at most).
TOLERANCE = 5e-5


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "eval",
        help="run the run's evaluation again on a promoted checkpoint: does it reproduce its figure?",
        description="Exit 0: the figure recorded at promotion is reproduced to the 4th decimal; "
        "1: it is not (the evaluation is not deterministic); 2: bad input.",
    )
    sp.add_argument("run", nargs="?", help="a run id (default: the newest run)")
    sp.add_argument(
        "--step", type=int, help="the checkpoint at this step (default: the newest evaluated one)"
    )
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_eval)


def policy_of(rec: runs.RunRecord) -> Eval:
    """The evaluation the run's keeper gates by: the launch flag over the project's [eval]."""
    try:
        config, _ = load_config(rec.cwd, runs.state_dir())
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    return eval_policy(rec.options, config)


def pick(checkpoints: list[CheckpointView], step: int | None) -> CheckpointView:
    evaluated = [
        c
        for c in checkpoints
        if c.state == "verified" and c.eval is not None and c.eval.figure is not None and c.report is not None
    ]
    if step is not None:
        evaluated = [c for c in evaluated if c.step == step]
    if not evaluated:
        at = f" at step {step}" if step is not None else ""
        raise CliError(f"no promoted checkpoint{at} has an evaluation figure to reproduce")
    return max(evaluated, key=lambda c: (c.step if c.step is not None else -1, c.t))


def recorded_policy(current: Eval | None, fig: p.EvalFigure) -> tuple[Eval, str | None]:
    """The evaluation as it ran at promotion (its command and pattern, kept with its figure), and
    a note when today's [eval] / --eval-command says otherwise. A figure recorded before commands
    were kept is reproduced with today's, and says so."""
    if fig.command:
        base = current if current is not None else Eval()
        policy = msgspec.structs.replace(base, command=fig.command, pattern=fig.pattern)
        differs = current is not None and (current.command, current.pattern) != (fig.command, fig.pattern)
        return policy, (
            "the run's [eval] now says otherwise; the command recorded with the figure is run"
            if differs
            else None
        )
    if current is None or not current.command:
        raise CliError("no evaluation command was recorded with this figure and none is set now")
    return current, "no command was recorded with this figure: today's [eval] is run, which may differ"


def cmd_eval(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    rec = runs.read_record(Path(info.run_dir))
    st = runs.load_state(info.run_dir)
    try:
        current: Eval | None = policy_of(rec)
    except CliError:
        current = None  # a trainroom.toml broken since: the recorded command still runs
    if (current is None or not current.command) and not any(c.eval is not None for c in st.checkpoints):
        raise CliError(
            f"run {info.run_id} has no evaluation: set [eval] command in trainroom.toml or --eval-command"
        )
    c = pick(st.checkpoints, args.step)
    assert c.eval is not None and c.eval.figure is not None and c.report is not None
    policy, note = recorded_policy(current, c.eval)
    path = c.report.promoted_file or c.path
    if not os.path.exists(path):
        raise CliError(f"the checkpoint at step {c.step} is gone from {path}")
    got = evaluate(policy, path, step=c.step, run_id=info.run_id, cwd=rec.cwd, best=None)
    recorded = c.eval.figure
    same = got.figure is not None and math.isfinite(got.figure) and abs(got.figure - recorded) <= TOLERANCE
    out = {
        "run": info.run_id,
        "step": c.step,
        "checkpoint": path,
        "recorded": recorded,
        "figure": got.figure,
        "reproduces": same,
        "seconds": got.seconds,
        "why": None if got.figure is not None else got.why,
        "command": policy.command,
        "note": note,
    }
    if args.json:
        print(to_json(out))
        return 0 if same else 1
    if got.figure is None:
        print(f"step {c.step}: the evaluation gave no figure this time ({got.why}); recorded {recorded:.4f}")
    elif same:
        print(f"step {c.step}: reproduces: {got.figure:.4f} (recorded {recorded:.4f}) in {got.seconds:.1f} s")
    else:
        print(
            f"step {c.step}: does not reproduce: {got.figure:.4f}, recorded {recorded:.4f} "
            f"(off by {abs(got.figure - recorded):.4g}): the evaluation is not deterministic, so a "
            "regression it judges may be noise"
        )
    print(f"ran `{policy.command}`" + (f" ({note})" if note else ""))
    return 0 if same else 1
