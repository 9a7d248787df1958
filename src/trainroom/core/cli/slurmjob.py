"""`trainroom job slurm:JOBID [--json]` and `trainroom job --slurm`: a Slurm job's runs and
Slurm's own view of it, merged (core/job/slurm.py)."""

from __future__ import annotations

import argparse
import getpass
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.cli.errors import CliError
from trainroom.core.cli.output import to_json
from trainroom.core.job.discover import job_runs, newest_job
from trainroom.core.job.slurm import SlurmJobError, read_slurm_job, slurm_view
from trainroom.core.job.view import NodeReading, job_dict
from trainroom.core.run import store
from trainroom.core.run.store import RunError
from trainroom.core.slurm.scontrol import SlurmError, SlurmReader
from trainroom.core.units import fmt_duration


def newest_slurm_job() -> str:
    """My newest job slurmctld knows, else the newest `slurm-<JOBID>` run here."""
    try:
        found = SlurmReader().newest_job_of(getpass.getuser())
    except SlurmError:
        found = None
    if found:
        return found
    try:
        name = newest_job()
    except RunError:
        name = ""
    if name.startswith("slurm-"):
        return name.removeprefix("slurm-")
    raise CliError("--slurm: no job of yours in squeue, and no slurm-<JOBID> run here")


def slurm_job_dict(
    job_id: str, reader: SlurmReader | None = None, now: float | None = None
) -> dict[str, Any]:
    t = time.time() if now is None else now
    try:
        job = read_slurm_job(job_id, reader or SlurmReader(), now=t)
    except SlurmJobError as exc:
        raise CliError(str(exc)) from None
    d = job_dict(job.name, job.readings, t)
    d["slurm"] = slurm_view(job, t)
    return d


def slurm_lines(s: dict[str, Any]) -> list[str]:
    j = s["job"]
    if j is None:
        return [
            f"slurm job {s['job_id']}: slurmctld does not know it ({s['error'] or 'purged'}); from the runs here"
        ]
    left = (
        f", {fmt_duration(j['time_left_s'])} left of {fmt_duration(j['time_limit_s'])}"
        if j["time_left_s"] is not None
        else ""
    )
    reason = f" ({j['reason']})" if j["reason"] else ""
    out = [
        f"slurm job {s['job_id']}: {j['state']}{reason}{left}, restarts {j['restarts'] if j['restarts'] is not None else '?'}"
        + (f": {s['state_words']}" if s["state_words"] else "")
    ]
    if j["exit_code"] is not None:
        out.append(
            f"  ExitCode {j['exit_code']}, DerivedExitCode {j['derived_exit_code']}"
            + (f" ({s['derived_exit']})" if s["derived_exit"] else "")
        )
    if s.get("eligible_in_s") is not None:
        out.append(
            f"  eligible to start again in {fmt_duration(s['eligible_in_s'])} (Slurm's wait after a requeue)"
        )
    for n in s["nodes"]:
        why = f": {n['reason']}" if n.get("reason") else ""
        out.append(f"  node {n['node']:12} {n['state']}{why}  [read by {n.get('read_by') or 'nothing'}]")
    out += [f"  {v['code']}: {v['message']}" for v in s["verdicts"]]
    return out


def cmd_slurm_job(
    args: argparse.Namespace,
    job_id: str,
    job_lines: Callable[[dict[str, Any], float], list[str]],
    healthy: Collection[str],
    open_tui: Callable[[argparse.Namespace], int],
) -> int:
    if args.stacks:
        from trainroom.core.job.actions import stacks_lines

        report = dump_ranks(job_id)
        print(to_json(report) if args.json else "\n".join(stacks_lines(report)))
        return 0 if report["ranks"] and not report["not_arrived"] else 1
    if args.resume:
        return resume_job(args, job_id)
    if args.kill:
        return stop_survivors(args, job_id)
    if args.tui:
        if args.json:
            raise CliError("--tui and --json: choose one")
        args.slurm_job_id = job_id
        return open_tui(args)
    d = slurm_job_dict(job_id)
    now = time.time()
    print(to_json(d) if args.json else "\n".join(slurm_lines(d["slurm"]) + job_lines(d, now)))
    bad = any(v["code"] == "NODE_LOST" for v in d["slurm"]["verdicts"])
    return 0 if d["state"] in healthy and not bad else 1


def dump_ranks(job_id: str) -> dict[str, Any]:
    """Every live rank's stacks, each through its own node's keeper (`srun --overlap -w NODE
    trainroom dump RUN [--rank R] --yes --json`, one step a rank, all at once), compared: where
    most ranks wait, and which did not arrive there. A rank whose reporter is connected is
    dumped through it (`--rank`); a run that is one rank (a task per rank) is its trainer."""
    from trainroom.core.job.actions import compare_stacks, dump_entries, each
    from trainroom.core.job.slurm import srun_run

    try:
        job = read_slurm_job(job_id, SlurmReader())
    except SlurmJobError as exc:
        raise CliError(str(exc)) from None
    todo: list[tuple[NodeReading, int | None, int | None]] = []  # reading, rank, --rank
    for r in job.readings:
        a = r.state.attempt if r.state is not None else None
        if r.state is None or r.keeper != "alive" or not r.run or not r.host or a is None or not a.alive:
            continue
        ranks = [v for v in r.state.ranks.values() if v.attempt == a.n]
        heard = sorted((v for v in ranks if v.connected), key=lambda v: v.rank)
        if len(ranks) > 1 and heard:  # each rank through its reporter
            todo += [(r, v.rank, v.rank) for v in heard]
        else:  # the trainer (a task per rank), or each torchrun worker of the node by py-spy
            todo.append(
                (r, ranks[0].rank if len(ranks) == 1 else r.node_rank, heard[0].rank if heard else None)
            )

    def one(item: tuple[NodeReading, int | None, int | None]) -> list[dict[str, Any]]:
        r, rank, via = item
        out: dict[str, Any] = {
            "rank": rank,
            "node_rank": r.node_rank,
            "host": r.host,
            "node": r.host,
            "run": r.run,
        }
        verb = ["dump", str(r.run), "--yes", "--json", *(["--rank", str(via)] if via is not None else [])]
        rc, stdout, stderr = srun_run(job_id, str(r.host), verb)
        text = stdout[stdout.find("{") :] if "{" in stdout else ""  # the JSON reply, however indented
        try:
            d = msgspec.json.decode(text) if text else None
        except msgspec.DecodeError:
            d = None
        if not isinstance(d, dict):
            why = (stderr.strip() or stdout.strip() or f"exit {rc}").splitlines()[-1:]
            return [{**out, "ok": False, "message": f"srun on {r.host}: {' '.join(why)}", "stacks": ""}]
        return dump_entries(out, bool(d.get("ok")), str(d.get("message", "")), d.get("after") or {})

    return compare_stacks([d for got in each(one, todo) for d in got])


def survivors(readings: list[NodeReading]) -> list[dict[str, Any]]:
    """The runs whose trainer still runs (its keeper alive): what `srun -K` would have ended."""
    out = []
    for r in readings:
        a = r.state.attempt if r.state is not None else None
        if r.keeper == "alive" and r.run and a is not None and a.alive and a.pid > 0:
            out.append({"node": r.host or "", "run": r.run, "pid": a.pid, "node_rank": r.node_rank})
    return out


def stop_survivors(args: argparse.Namespace, job_id: str) -> int:
    """Stop every live trainer of the job (after a rank died), each through its own keeper's kill
    on its node (`srun --overlap ... trainroom kill RUN`), confirmed once for all of them."""
    from trainroom.core.job.slurm import srun_act

    try:
        job = read_slurm_job(job_id, SlurmReader())
    except SlurmJobError as exc:
        raise CliError(str(exc)) from None
    todo = survivors(job.readings)
    if not todo:
        print("no live trainer left in this job: nothing to stop")
        return 1
    for t in todo:
        print(f"stop: task {t['node_rank']} on {t['node']}: run {t['run']}, trainer pid {t['pid']}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("job --kill needs confirmation: pass --yes (stdin is not a terminal)")
        if input(f"stop {len(todo)} trainer(s) of slurm job {job_id}? [y/N] ").strip().lower() not in (
            "y",
            "yes",
        ):
            print("cancelled")
            return 1
    grace = ["--grace", str(args.grace_s)] if args.grace_s is not None else []
    results = [srun_act(job_id, t["node"], ["kill", t["run"], "--yes", "--json", *grace]) for t in todo]
    ok = True
    for t, (rc, out) in zip(todo, results, strict=True):
        ok = ok and rc == 0
        print(f"task {t['node_rank']} on {t['node']}: {'ok' if rc == 0 else f'failed ({rc})'}: {out}")
    return 0 if ok else 1


REQUEUEABLE = (
    "RUNNING",
    "SUSPENDED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
)


def resume_job(args: argparse.Namespace, job_id: str, reader: SlurmReader | None = None) -> int:
    """Requeue the job (its next attempt resumes from the newest verified checkpoint of its runs),
    or, when slurmctld no longer knows it, print the sbatch that starts it again from there."""
    import shlex

    from trainroom.core.cli.foreground import ENV_RESUME_JOB, previous_verified
    from trainroom.core.job.slurm import job_name_of

    reader = reader or SlurmReader()
    try:
        info = reader.job(job_id)
    except SlurmError as exc:
        raise CliError(f"slurm:{job_id}: {exc}") from None
    name = job_name_of(info, job_id)
    found = previous_verified(name)
    where = (
        f"the next attempt resumes from step {found[1]} ({found[0]})"
        if found is not None
        else "no verified checkpoint of this job is visible here: the next attempt starts from its beginning"
    )
    if info is None:
        runs = list(job_runs(name))
        if not runs:
            raise CliError(f"slurm:{job_id}: slurmctld does not know the job and no run of {name} is here")
        rec = store.read_record(Path(runs[-1].run_dir))
        place = rec.options.slurm
        nodes = place.nnodes if place is not None else 1
        tasks = place.ntasks if place is not None else 1
        from trainroom.core.cli.requeue import launch_flags

        launch = ["trainroom", "launch", *launch_flags(rec.options), "--", *rec.argv]
        cmd = " ".join(shlex.quote(a) for a in launch)
        print(f"slurm job {job_id} is gone from slurmctld; {where}. Start it again with:")
        print(
            f"  cd {shlex.quote(rec.cwd)} && sbatch -N{nodes} -n{tasks} --export=ALL,{ENV_RESUME_JOB}={name} "
            f"--wrap {shlex.quote('srun ' + cmd)}"
        )
        return 0
    if info.state not in REQUEUEABLE or info.requeue is False:
        raise CliError(
            f"slurm:{job_id} is {info.state}"
            + (" and not requeueable (--no-requeue)" if info.requeue is False else ": nothing to requeue")
        )
    print(f"requeue slurm job {job_id} ({info.state}, restarts {info.restarts}); {where}")
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("job --resume needs confirmation: pass --yes (stdin is not a terminal)")
        if input("requeue? [y/N] ").strip().lower() not in ("y", "yes"):
            print("cancelled")
            return 1
    from trainroom.core.slurm.scontrol import run_command

    try:
        rc, out, err = run_command(["scontrol", "requeue", job_id])
    except SlurmError as exc:
        raise CliError(str(exc)) from None
    if rc != 0:
        print(f"scontrol requeue {job_id} failed: {(err or out).strip()}")
        return 1
    after = SlurmReader(min_interval_s=0).job(job_id)
    print(
        f"slurm job {job_id}: {info.state} -> {after.state if after else '?'} (restarts {info.restarts} -> {after.restarts if after else '?'})"
    )
    return 0
