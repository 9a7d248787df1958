"""Attaching: a run for a trainer trainroom did not start, under a keeper that adopts it.

`attach` records what was read of the process (probes.adopt: argv, cwd, environment, start tick,
log, checkpoint directory) in the run record's `attached` field, links the run's trainer.log to the
trainer's own log so every reader of a run's log reads it, watches the checkpoint directory's
usual shapes (nanoGPT's ckpt.pt, Lightning's .ckpt, HF's checkpoint-N/) and starts the keeper,
which adopts the process instead of starting one (keeper.adopt)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.probes.adopt import Adoptee
from trainroom.core.run import store as runs
from trainroom.core.run.launch import KEEPER_WAIT_S, check_config, check_options, start_keeper
from trainroom.core.run.store import RunError, RunInfo


def watch_globs(ckpt_dir: str) -> list[str]:
    """The checkpoint shapes looked for in a trainer's checkpoint directory."""
    return [os.path.join(ckpt_dir, g) for g in ("*.pt", "*.ckpt", "checkpoint-*")]


def take_up(info: RunInfo, env: Mapping[str, str] | None = None, wait_s: float = KEEPER_WAIT_S) -> RunInfo:
    """A new keeper for a run whose keeper died: same run, same journal (keeper.takeup); it
    takes back the last attempt's process if it still runs, else waits for a resume."""
    run_dir = Path(info.run_dir)
    rec = runs.read_record(run_dir)
    if runs.keeper_alive(rec):
        return info
    (run_dir / runs.SOCKET_NAME).unlink(missing_ok=True)  # the dead keeper's: not a sign of the new one
    return start_keeper(run_dir, rec, env, wait_s)


def orphan_of(a: Adoptee) -> RunInfo | None:
    """The run this process was started by, when its keeper is gone: attaching takes that run up."""
    if not a.was_run:
        return None
    try:
        info = runs.resolve_run(a.was_run)
    except RunError:
        return None
    return None if info.alive or info.remote else info


def watched_by(a: Adoptee) -> str | None:
    """The run whose live keeper already supervises this process (its environment names it)."""
    if not a.was_run:
        return None
    try:
        info = runs.resolve_run(a.was_run)
    except RunError:
        return None
    return info.run_id if info.alive else None


def attach(
    a: Adoptee,
    options: LaunchOptions | None = None,
    *,
    log: str | None = None,
    ckpt: str | None = None,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    wait_s: float = KEEPER_WAIT_S,
) -> RunInfo:
    """Start a keeper that adopts `a`; the run's id and socket once it is up."""
    watcher = watched_by(a)
    if watcher is not None:
        raise RunError(f"pid {a.pid} is already watched by run {watcher}: `trainroom watch {watcher}`")
    orphaned = orphan_of(a)
    if orphaned is not None:
        return take_up(orphaned, env, wait_s)  # its own run, under a new keeper
    if log is not None:
        log = os.path.abspath(log)
        if not os.path.isfile(log):
            raise RunError(f"--log {log}: no such file")
        a = msgspec.structs.replace(a, log=log, log_why="--log")
    if ckpt is not None:
        a = msgspec.structs.replace(a, ckpt_dir=os.path.abspath(ckpt), ckpt_from="--ckpt")
    opts = options or LaunchOptions()
    if a.ckpt_dir and not opts.watch_ckpt:
        opts = msgspec.structs.replace(opts, watch_ckpt=watch_globs(a.ckpt_dir))
    check_config(a.cwd)
    check_options(opts)
    run_dir, rec = runs.create_run(list(a.argv), a.cwd, opts, name=name)
    rec.attached = a
    runs.write_record(run_dir, rec)
    if a.log:
        # Every reader of the run's log (the control room, the keeper's tail) reads the trainer's
        # own; a takeover's attempts append to it too, as the user's `tail -f` expects.
        (Path(run_dir) / runs.LOG_NAME).symlink_to(a.log)
    return start_keeper(run_dir, rec, env, wait_s)
