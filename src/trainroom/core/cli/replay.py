"""`trainroom replay [RUN] --step N [--fp32] [--device D]`: the forensic step after a loss spike. The
run's own command starts again, away from its keeper, from the last verified checkpoint before step
N, with the batch step N trained on (and the batches of the steps between) in its environment (see
`sdk.replay_request`); it prints the replayed loss, and the verdict compares it with what the run
saw: the spike reproduces (the data or the numerics: look at the batch, then try --fp32), or it does
not (non-determinism, collectives, memory, hardware). Exit 0 reproduces, 1 does not, 2 bad input.

It never touches the run, live or ended: its `save_checkpoint` saves go to a scratch root of its
own (runs/<id>/replays/…/checkpoints), and whatever else it writes into the run's working
directory, checkpoint root or watched paths lands in that scratch directory (`ops.isolate`: an
overlay in a mount namespace of its own). While the run trains it runs beside it, on the device it
is told (`--device cpu|N`) or the run's own, refused only when that would share a GPU with the live
trainer and the GPU's free memory cannot take it (`ops.replayplace`, with the figures)."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainroom.core.cli.errors import CliError
from trainroom.core.ops import isolate
from trainroom.core.ops.evaluate import figure_in, run_bounded
from trainroom.core.ops.replayplace import PlaceError, Placement, parse_device, place
from trainroom.core.probes import procs
from trainroom.core.run import store as runs
from trainroom.core.run.client import current_state
from trainroom.core.run.ended import returncode_ended
from trainroom.core.run.parts import CheckpointView
from trainroom.core.run.state import RunState
from trainroom.core.sdk.replay import ENV_OF, ReplayRequest, replay_env
from trainroom.core.units import to_json
from trainroom.core.wire import protocol as p

REPLAY_PATTERN = r"replay_loss=(?P<loss>\S+)"
# What the run's keeper gave its trainer and a replay must not have: it runs on its own.
KEEPER_ENV = ("TRAINROOM_SOCKET", "TRAINROOM_RUN", "TRAINROOM_RUN_DIR", "TRAINROOM_ATTEMPT")
BASELINE_STEPS = 20  # the recorded steps before N whose median loss is the level a spike is above


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "replay",
        help="replay the batch of step N from the checkpoint before it: does the spike reproduce?",
        description="Exit 0: the spike reproduces; 1: it does not (or step N was no spike); 2: bad input. "
        "The trainer reads the replay with trainroom.core.sdk.replay_request() and prints "
        "replay_loss=X (sdk.replay_result).",
    )
    sp.add_argument("run", nargs="?", help="a run id (default: the newest run)")
    sp.add_argument("--step", type=int, required=True, help="the step whose batch is replayed")
    sp.add_argument("--fp32", action="store_true", help="ask the trainer to replay in fp32 (no autocast)")
    sp.add_argument(
        "--device",
        help="where the replay runs: cpu or a GPU index (default: as the run was started; while it "
        "trains, its own GPU if that GPU's free memory allows a second copy)",
    )
    sp.add_argument("--timeout", type=float, default=900.0, help="seconds the replay may take (default 900)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_replay)


def window_of(st: RunState, step: int) -> tuple[p.BatchLog, p.BatchRow]:
    """The newest journaled batch window holding `step`, and its row."""
    for log in reversed(st.batch_logs):
        for row in log.rows:
            if row.step == step:
                return log, row
    if not st.batch_logs:
        raise CliError(
            "no batches were recorded for this run: a trainer names them with rep.step(..., batch=...), "
            "and the keeper keeps the window around each loss spike, divergence or non-finite value"
        )
    known = ", ".join(f"{lg.rows[0].step}-{lg.rows[-1].step} ({lg.code})" for lg in st.batch_logs if lg.rows)
    raise CliError(f"no batch recorded for step {step}; recorded: steps {known}")


def checkpoint_before(st: RunState, step: int) -> CheckpointView:
    ok = [
        c
        for c in st.checkpoints
        if c.state == "verified"
        and c.step is not None
        and c.step < step
        and os.path.exists((c.report.promoted_file if c.report is not None else None) or c.path)
    ]
    if not ok:
        raise CliError(f"no verified checkpoint before step {step} is left to replay from")
    return max(ok, key=lambda c: (c.step or 0, c.t))


def verdict(
    step: int, recorded: float | None, replayed: float, before: list[float], st: RunState, fp32: bool
) -> tuple[bool, str, dict[str, Any]]:
    """Whether the spike reproduces, in words, with the figures it was judged on."""
    th = st.thresholds
    base = statistics.median(before) if before else None
    band = max(th.spike_min_nats, th.spike_min_rel * abs(base)) if base is not None else None
    figures = {"recorded": recorded, "replayed": replayed, "baseline": base, "band": band}
    if base is None or band is None or recorded is None or not math.isfinite(base):
        return (
            False,
            f"step {step}: replayed loss {replayed:.4f}; no recorded loss around it to judge by",
            figures,
        )
    if math.isnan(replayed):
        return (
            False,
            f"step {step}: the replay gave nan: no figure, so never a reproduction (the replay itself went "
            "non-finite: look at its output)",
            figures,
        )
    spike = not math.isfinite(recorded) or recorded > base + band
    again = not math.isfinite(replayed) or replayed > base + band
    rec_s = f"{recorded:.4f}" if math.isfinite(recorded) else str(recorded)
    said = f"replayed {replayed:.4f}, recorded {rec_s}, level before it {base:.4f} (+{band:.3g} is a spike)"
    if not spike:
        return False, f"step {step} was no spike, so nothing reproduces: {said}", figures
    if again:
        cause = (
            "the data (look at this batch)"
            if fp32
            else "the data or the numerics (look at this batch; --fp32 tells which)"
        )
        return (
            True,
            f"the spike at step {step} reproduces from the checkpoint before it: {said}: {cause}",
            figures,
        )
    return (
        False,
        f"the spike at step {step} does not reproduce with the same batch: {said}: not the batch alone; "
        "look at non-determinism, collectives, memory and the hardware",
        figures,
    )


def still_training(info: runs.RunInfo, st: RunState, keeper_alive: bool) -> str | None:
    """Why the run still trains (its keeper lives and its attempt has not ended, or its trainer's
    pid lives), or None. A replay beside the live run is placed on a device (replayplace) and must
    be isolated (ops.isolate), never run as it would be after the run."""
    a = st.attempt
    if a is None:
        return f"run {info.run_id} is starting (its keeper is alive)" if keeper_alive else None
    if a.ended_at is not None:
        return None
    if keeper_alive:
        return f"run {info.run_id} is still training (attempt {a.n}, trainer pid {a.pid}, its keeper alive)"
    ticks = procs.start_ticks(a.pid)
    if ticks is None or (a.start_ticks is not None and ticks != a.start_ticks):
        return None  # gone, or the pid is another process's now
    return f"run {info.run_id} may still be training (its keeper is gone, trainer pid {a.pid} lives)"


def scratch_dir(run_dir: Path, step: int) -> Path:
    """A new directory of the replay's own under the run's directory: its checkpoint root."""
    base = run_dir / "replays"
    base.mkdir(mode=0o700, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    d = Path(tempfile.mkdtemp(prefix=f"{stamp}-step{step}-", dir=base))
    (d / "checkpoints").mkdir(mode=0o700)
    return d


def covered_dirs(st: RunState, cwd: str) -> list[str]:
    """The directories whose writes a replay must keep from the run: its working directory, its
    checkpoint root and the fixed part of each watched path (each relative to the cwd)."""
    out = [cwd]
    if st.options.ckpt_root:
        out.append(os.path.join(cwd, os.path.expanduser(st.options.ckpt_root)))
    for pattern in st.options.watch_ckpt:
        fixed = Path(os.path.join(cwd, os.path.expanduser(pattern)))
        while any(ch in fixed.name for ch in "*?[") or not fixed.is_dir():
            if fixed.parent == fixed:
                break
            fixed = fixed.parent
        out.append(str(fixed))
    return [str(c) for c in isolate.covers(out)]


def cmd_replay(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    rec = runs.read_record(Path(info.run_dir))
    st = runs.load_state(info.run_dir)
    live, keeper_alive = current_state(info) if info.alive else (st, False)
    busy = still_training(info, live, keeper_alive)
    try:
        asked = parse_device(args.device) if args.device is not None else None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        where = place(asked, busy is not None, live.probe.gpu if live.probe is not None else None)
    except PlaceError as exc:
        raise CliError(f"{busy}: {exc}" if busy is not None else str(exc)) from None
    log, row = window_of(st, args.step)
    ckpt = checkpoint_before(st, args.step)
    assert ckpt.step is not None
    between = {r.step: r.batch for r in log.rows if ckpt.step < r.step < args.step}
    scratch = scratch_dir(Path(info.run_dir), args.step)
    req = ReplayRequest(
        step=args.step,
        batch=row.batch,
        ckpt=(ckpt.report.promoted_file if ckpt.report is not None else None) or ckpt.path,
        ckpt_step=ckpt.step,
        batches=between,
        fp32=args.fp32,
        scratch_root=str(scratch / "checkpoints"),
        device=where.device or "",
    )
    env = {k: v for k, v in os.environ.items() if k not in KEEPER_ENV}
    env.update(replay_env(req))
    env.update(where.env)
    env[ENV_OF] = info.run_id  # the run's keeper takes it for no duplicate of its trainer
    covered = covered_dirs(st, rec.cwd)
    written = isolate.upper_dir(
        scratch / "written", [Path(c) for c in covered], f"trainroom-replay-{info.run_id}-"
    )
    argv = [sys.executable, "-m", "trainroom.core.ops.isolate", "--upper", str(written)]
    argv += [a for c in covered for a in ("--cover", c)]
    argv += ([] if busy is not None else ["--or-plain"]) + ["--", *rec.argv]
    code, out, timed_out = run_bounded(argv, rec.cwd, env, args.timeout, idle=False)
    if code == isolate.CANNOT and isolate.MARK in out:
        line = next(ln for ln in out.splitlines() if isolate.MARK in ln)
        raise CliError(f"{line}: {busy}, so the replay does not run beside it; replay once it has ended")
    if code is None or timed_out or code != 0:
        why = (
            out if code is None else f"ran past {args.timeout:.0f} s" if timed_out else returncode_ended(code)
        )
        tail = " | ".join(ln for ln in out.strip().splitlines()[-3:]) if code is not None else ""
        raise CliError(f"the replay of step {args.step} failed: {why}" + (f": {tail}" if tail else ""))
    isolated = isolate.MARK not in out
    replayed = figure_in(out, REPLAY_PATTERN)
    if replayed is None:
        raise CliError(
            f"the replay ran but printed no replay_loss=: `{shlex.join(rec.argv)}` must read "
            "sdk.replay_request() and end with sdk.replay_result(loss)"
        )
    before = [r.loss for r in log.rows if r.step < args.step and r.loss is not None and math.isfinite(r.loss)]
    ok, words, figures = verdict(args.step, row.loss, replayed, before[-BASELINE_STEPS:], st, args.fp32)
    if args.json:
        print(
            to_json(
                {
                    "run": info.run_id,
                    "step": args.step,
                    "batch": row.batch,
                    "checkpoint": req.ckpt,
                    "checkpoint_step": ckpt.step,
                    "steps_between": len(between),
                    "scratch_root": req.scratch_root,
                    "device": where.device,
                    "placement": where.words,
                    "beside_live_run": busy is not None,
                    "writes_isolated": isolated,
                    "covered": covered if isolated else [],
                    "written": str(written / "upper"),
                    "reproduces": ok,
                    "verdict": words,
                    **figures,
                }
            )
        )
    else:
        print(
            f"replayed step {args.step} (batch {_batch_words(row.batch)}) from step {ckpt.step}'s checkpoint"
        )
        print(words)
        print(_where_words(where, busy is not None, isolated, covered, written))
    return 0 if ok else 1


def _where_words(where: Placement, live: bool, isolated: bool, covered: list[str], written: Path) -> str:
    ran = f"it ran {where.words}" + (", beside the live run" if live and "beside" not in where.words else "")
    if not isolated:
        return f"{ran}; its own writes were not isolated (see above)"
    return f"{ran}; what it wrote into {', '.join(covered)} is in {written / 'upper'}, not there"


def _batch_words(b: p.BatchRef) -> str:
    parts = [
        f"{k} {v}"
        for k, v in (("epoch", b.epoch), ("index", b.index), ("seed", b.seed), ("tag", b.tag))
        if v is not None
    ]
    if b.ids:
        parts.append(f"{len(b.ids)} ids")
    return ", ".join(parts) or "unnamed"
