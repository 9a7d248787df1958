"""Finding a job's runs on this host: the run record names its job (`launch --job`, or torchrun's
rendezvous id), so the newest run of a job is found by name, as the bridge does for a remote
`trainroom job ssh://host` that names no run."""

from __future__ import annotations

from pathlib import Path

from trainroom.core.configuration.settings import JobOptions
from trainroom.core.run import store
from trainroom.core.run.store import RunError, RunInfo


def job_of(info: RunInfo) -> JobOptions | None:
    """The job a local run belongs to, from its record (None: a run of its own)."""
    try:
        return store.read_record(Path(info.run_dir)).options.job
    except RunError:
        return None


def job_runs(name: str) -> list[RunInfo]:
    """This host's runs of job `name`, oldest first."""
    out = []
    for info in store.list_runs():
        job = job_of(info)
        if job is not None and job.name == name:
            out.append(info)
    return out


def newest_run_of(name: str) -> RunInfo:
    """The run of job `name` to watch here: the newest live one, else the newest."""
    runs = job_runs(name)
    if not runs:
        raise RunError(f"no run of job {name!r} under {store.runs_dir()}")
    live = [r for r in runs if r.alive]
    return (live or runs)[-1]


def newest_job() -> str:
    """The job of the newest run here that belongs to one (the live ones first)."""
    runs = store.list_runs()
    for pool in ([r for r in runs if r.alive], runs):
        for info in reversed(pool):
            job = job_of(info)
            if job is not None:
                return job.name
    raise RunError(f"no run under {store.runs_dir()} belongs to a job (launch it with --job NAME)")
