"""The keeper's side of checkpoints: every candidate the trainer announces (or a watched file an
uninstrumented trainer overwrites) is verified in a short-lived subprocess and then promoted or
kept in quarantine; the disk guard reads the checkpoint filesystem (or its byte budget) each
probe cycle. The rules live in checkpoints / verify / diskguard / checkpoint_watch; this module
schedules them and turns their verdicts into records and findings.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import checkpoint_watch as watch
from . import diskguard
from . import protocol as p
from .checkpoints import Quarantine, expected_for, keep_verified_copy, latest_checkpoint, settle
from .findings import Finding
from .verify import findings_for_report, verify_in_subprocess

if TYPE_CHECKING:
    from .keeper import Keeper


def checkpoint_root(keeper: Keeper) -> Path:
    opt = keeper.options.get("ckpt_root")
    if opt:
        return Path(opt)
    cfg_root = keeper.config.checkpoints.root
    if cfg_root:
        return Path(cfg_root) if os.path.isabs(cfg_root) else Path(keeper.record.cwd) / cfg_root
    return keeper.run_dir / "checkpoints"


class CheckpointPipeline:
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper
        self.root = checkpoint_root(keeper)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = int(keeper.options.get("keep") or keeper.config.checkpoints.keep)
        self.budget = keeper.options.get("disk_budget_bytes")
        self.globs = list(keeper.options.get("watch_ckpt") or keeper.config.checkpoints.watch)
        self.keep_copies = bool(keeper.options.get("keep_verified_copies"))
        self.verifying: set[str] = set()
        self.reports: dict[str, dict[str, Any]] = {}  # path -> last verdict
        self.saves: list[tuple[float, int]] = []
        self.usage: diskguard.DiskUsage | None = None
        self.mount: diskguard.MountEntry | None = None
        self.prunable: int | None = None
        self.watch_state = watch.WatchState()
        self.sightings: list[watch.Sighting] = []
        self.declared_arch: dict[str, Any] = {}
        self._started = False

    # ------------------------------------------------------------------ records (loop thread)

    def observe(self, rec: Any) -> None:
        if not isinstance(rec, p.Received):
            return
        msg = rec.msg
        if isinstance(msg, p.Hello) and msg.config.arch:
            self.declared_arch = dict(msg.config.arch)
        elif isinstance(msg, p.Checkpoint):
            if msg.size_bytes:
                self.saves.append((rec.t, int(msg.size_bytes)))
                del self.saves[:-64]
            self._schedule(msg.path, expected_for(self.root, self.declared_arch or None, msg.path))

    def _schedule(self, path: str, expected: dict[str, Any], request: watch.VerifyRequest | None = None) -> None:
        if path in self.verifying:
            return
        self.verifying.add(path)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.verifying.discard(path)
            return
        loop.create_task(self._verify(path, expected, request))

    async def _verify(self, path: str, expected: dict[str, Any], request: watch.VerifyRequest | None) -> None:
        k = self.keeper
        step = expected.get("step")
        k.emit(p.CheckpointState(path=path, step=step, state="verifying", t=time.time()))
        report = await asyncio.to_thread(verify_in_subprocess, path, expected or None)
        try:
            if request is None:
                rec = await asyncio.to_thread(settle, path, report, self.root)
                k.emit(rec)
            else:
                current = await asyncio.to_thread(watch.stat_one, path)
                self.watch_state, recs, stood = watch.record_verdict(self.watch_state, request, report, current,
                                                                     time.time())
                for r in recs:
                    k.emit(r)
                if stood and report.get("ok") and self.keep_copies:
                    copy = await asyncio.to_thread(keep_verified_copy, path, report, self.root)
                    if copy is not None:
                        k.emit(p.KeeperNote(t=time.time(), message=f"kept a verified copy of {path} at {copy}"))
            self.reports[path] = report
        except Exception as exc:  # promotion failed: say so, keep the keeper
            k.emit(p.CheckpointState(path=path, step=step, state="rejected", t=time.time(),
                                     reason=f"could not settle: {type(exc).__name__}: {exc}"))
            self.reports[path] = {"ok": False, "reason": str(exc), "path": path}
        finally:
            self.verifying.discard(path)
            k.journal.flush()

    def start(self) -> None:
        """At keeper start: finish what a previous keeper left half done, verify leftovers."""
        self._started = True
        try:
            Quarantine(self.root).sweep()
            leftovers = Quarantine(self.root).candidates()
        except OSError:
            leftovers = []
        for c in leftovers:
            self._schedule(str(c), expected_for(self.root, None, c))

    # ------------------------------------------------------------------ probes (worker thread)

    def disk_sample(self) -> dict[str, Any]:
        try:
            if self.budget:
                usage = diskguard.budget_usage(self.root, int(self.budget))
            else:
                usage = diskguard.disk_usage(self.root)
            self.mount = diskguard.mount_of(self.root, diskguard.read_mounts())
            from .prune import plan

            self.prunable = plan(self.root, self.keep, protect=list(self.verifying)).bytes_to_free
        except (OSError, ValueError) as exc:
            return {"path": str(self.root), "error": str(exc)}
        self.usage = usage
        if self.globs:
            self.sightings = watch.sight(self.globs, self.keeper.record.cwd)
        out = usage.as_dict()
        out["budget_bytes"] = self.budget
        if self.mount is not None:
            out.update(fstype=self.mount.fstype, mountpoint=self.mount.mountpoint)
        proj = diskguard.project(usage, self.saves, time.time())
        out["time_to_full_s"] = proj.time_to_full_s if proj is not None else None
        out["latest"] = str(latest_checkpoint(self.root) or "") or None
        return out

    # ------------------------------------------------------------------ findings (loop thread)

    def findings(self, now: float) -> list[Finding]:
        if not self._started:
            self.start()
        k = self.keeper
        out: list[Finding] = []
        th = k.config.thresholds
        if self.usage is not None:
            out += diskguard.disk_findings(self.usage, self.mount, self.saves, now, warn=th.disk_warn,
                                           critical=th.disk_critical, prunable_bytes=self.prunable)
        # A rejection stays open until a newer checkpoint verifies.
        newest_ok = max((c.step or -1 for c in k.state.checkpoints if c.state == "verified"), default=-1)
        for path, rep in list(self.reports.items()):
            c = k.state.checkpoint(path)
            if c is None or c.state != "rejected" or (c.step or -1) <= newest_ok and newest_ok >= 0:
                continue
            out += findings_for_report(rep)
        if self.globs:
            self.watch_state, requests, recs = watch.poll(self.watch_state, self.sightings, now)
            for r in recs:
                k.emit(r)
            for req in requests:
                self._schedule(req.path, dict(req.expected), req)
            out += watch.watch_findings(self.watch_state)
        return out
