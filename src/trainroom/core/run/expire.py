"""`trainroom runs --prune-older-than DURATION`: let old runs go, never a live one.

A plan first, always: which runs would go (their state, when they last changed, the bytes), and
which old runs stay and why. A run stays when its keeper lives, when any process still carries
its id in its environment (an orphaned trainer, a straggler), or when it holds checkpoints in its
own directory (unless told `--with-checkpoints`: they may be the only copy of a model).
Checkpoints outside the run's directory are never touched. The plan is carried out only when
asked (`--yes`), and each run is checked again just before it goes.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import msgspec
import psutil

from trainroom.core.probes.runof import run_of
from trainroom.core.run import store
from trainroom.core.run.store import RunInfo, RunRecord


class RunToPrune(msgspec.Struct, kw_only=True):
    run_id: str
    run_dir: str
    last_change: float  # the newest mtime among the run's files
    age_s: float
    bytes: int  # the run dir, checkpoints inside it included
    checkpoint_bytes: int = 0  # checkpoints inside the run dir
    checkpoint_files: int = 0
    kept: str | None = None  # why it stays, when it does


class RunPrunePlan(msgspec.Struct, kw_only=True):
    older_than_s: float
    now: float
    with_checkpoints: bool
    prune: list[RunToPrune]
    kept: list[RunToPrune]

    @property
    def bytes_to_free(self) -> int:
        return sum(r.bytes for r in self.prune)


class PruneResult(msgspec.Struct, kw_only=True):
    deleted: list[str] = []
    freed_bytes: int = 0
    skipped: dict[str, str] = {}  # run id -> why it was spared at the last moment


def _walk(root: Path) -> tuple[int, int]:
    """Bytes and files under `root` (lstat: links are not followed)."""
    total = files = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
            except OSError:
                pass
    return total, files


def last_change(run_dir: Path) -> float:
    """The newest mtime among the run's own files (journal, snapshots, logs, record)."""
    newest = 0.0
    try:
        entries = list(os.scandir(run_dir))
    except OSError:
        return newest
    for e in entries:
        try:
            if e.is_file(follow_symlinks=False):
                newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return newest


def carried_run_ids() -> set[str]:
    """Run ids in the environment of a live process (TRAINROOM_RUN): one sweep for all runs."""
    out: set[str] = set()
    me = os.getpid()
    for pid in psutil.pids():
        found = run_of(pid) if pid != me else None
        if found is not None and found.run:
            out.add(found.run)
    return out


def _checkpoints_inside(rec: RunRecord, run_dir: Path) -> Path | None:
    root = rec.checkpoint_root(run_dir)
    try:
        inside = root.resolve().is_relative_to(run_dir.resolve())
    except OSError:
        return None
    return root if inside and root.exists() else None


def _why_kept(info: RunInfo, rec: RunRecord, carried: set[str]) -> str | None:
    if info.alive or store.keeper_alive(rec):
        return f"its keeper (pid {rec.keeper_pid}) is alive"
    if info.run_id in carried:
        return "a live process still carries its id (an orphaned trainer? `trainroom kill` it first)"
    return None


def plan(older_than_s: float, *, with_checkpoints: bool = False, now: float | None = None) -> RunPrunePlan:
    now = time.time() if now is None else now
    carried = carried_run_ids()
    out = RunPrunePlan(
        older_than_s=older_than_s, now=now, with_checkpoints=with_checkpoints, prune=[], kept=[]
    )
    for info in store.list_runs():
        d = Path(info.run_dir)
        changed = last_change(d)
        if now - changed < older_than_s:
            continue
        try:
            rec = store.read_record(d)
        except store.RunError:
            continue
        total, _files = _walk(d)
        row = RunToPrune(
            run_id=info.run_id, run_dir=str(d), last_change=changed, age_s=now - changed, bytes=total
        )
        ck = _checkpoints_inside(rec, d)
        if ck is not None:
            row.checkpoint_bytes, row.checkpoint_files = _walk(ck)
        row.kept = _why_kept(info, rec, carried)
        if row.kept is None and row.checkpoint_files and not with_checkpoints:
            row.kept = (
                f"holds {row.checkpoint_files} checkpoint file(s) in {ck}: "
                "--with-checkpoints lets them go too"
            )
        (out.kept if row.kept else out.prune).append(row)
    return out


def carry_out(p: RunPrunePlan) -> PruneResult:
    """Delete what the plan says, checking each run again first (a keeper may have started)."""
    res = PruneResult()
    carried = carried_run_ids()
    for row in p.prune:
        d = Path(row.run_dir)
        try:
            rec = store.read_record(d)
        except store.RunError as exc:
            res.skipped[row.run_id] = str(exc)
            continue
        info = RunInfo(
            run_id=row.run_id, run_dir=row.run_dir, sock="", created=rec.created, argv=rec.argv, alive=False
        )
        why = _why_kept(info, rec, carried)
        if why is None and last_change(d) > row.last_change:
            why = "it changed since the plan was made"
        if why is not None:
            res.skipped[row.run_id] = why
            continue
        try:
            shutil.rmtree(d)
        except OSError as exc:
            res.skipped[row.run_id] = f"could not delete: {exc.strerror or exc}"
            continue
        res.deleted.append(row.run_id)
        res.freed_bytes += row.bytes
    return res
