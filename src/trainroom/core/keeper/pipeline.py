"""The keeper's side of checkpoints: every candidate the trainer announces (or a watched file an
uninstrumented trainer overwrites) is verified, then promoted or kept in quarantine; the disk
guard reads the checkpoint filesystem (or its byte budget) each probe cycle. The rules live in
checkpoints / verify / diskguard / checkpoint_watch / prune; this module schedules them and turns
their verdicts into records and findings.

Verification runs in one warm child process (`verify.WarmVerifier`: torch imported once, reused
for every checkpoint, restarted if it dies, closed when idle), fed by one queue in arrival order:
a trainer that checkpoints every step gets each checkpoint verified in about the time it takes
to read it, and never more than one verification competes with it for the CPU.

Thread model: `observe`, `findings` and the queue worker run on the keeper's loop thread (the
worker hands the blocking parts to a thread); `disk_sample` runs in the probe worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ckpt import watch as watch
from trainroom.core.ckpt.layout import (
    ENV_ROOT,
    QUARANTINE,
    Quarantine,
    _journal_report,
    expected_for,
    keep_verified_copy,
    latest_checkpoint,
    settle,
)
from trainroom.core.ckpt.verify import WarmVerifier, findings_for_report
from trainroom.core.findings import Finding
from trainroom.core.health import diskguard as diskguard
from trainroom.core.health.host import host_ram_low
from trainroom.core.samples import DiskSample

if TYPE_CHECKING:
    from trainroom.core.keeper.loop import Keeper

# A deferred verdict (verifier timed out or died, host RAM short) is tried again this much later,
# at most MAX_TRIES times in all; a leftover is tried again at the next keeper start.
RETRY_S = 30.0
MAX_TRIES = 3
# Seconds the warm verifier may sit idle before it is closed (its torch holds ~150 MB).
VERIFIER_IDLE_S = 300.0


def checkpoint_root(keeper: Keeper) -> Path:
    """The run's checkpoint root: `launch --ckpt-root`, then the project config's
    `checkpoints.root`, then TRAINROOM_CKPT_ROOT as the launching shell had it, then
    `<run dir>/checkpoints`."""
    opt = keeper.options.get("ckpt_root")
    if opt:
        return Path(opt)
    cfg_root = keeper.config.checkpoints.root
    if cfg_root:
        return Path(cfg_root) if os.path.isabs(cfg_root) else Path(keeper.record.cwd) / cfg_root
    env_root = os.environ.get(ENV_ROOT)
    if env_root:
        return Path(env_root).expanduser().absolute()
    return keeper.run_dir / "checkpoints"


def _own_root(path: str) -> Path | None:
    """The root a candidate was written under (`<root>/.quarantine/<file>`), or None for a file
    the trainer keeps elsewhere (that one is never moved)."""
    parent = Path(path).parent
    return parent.parent if parent.name == QUARANTINE else None


class _Job(msgspec.Struct, kw_only=True):
    key: str
    path: str
    request: watch.VerifyRequest | None = None  # a watched file's version; None: an announced candidate
    tries: int = 0


class CheckpointPipeline:
    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper
        self.root = checkpoint_root(keeper)
        self.root.mkdir(parents=True, exist_ok=True)
        # Recorded in the run record (the keeper writes it at start) and exported to every attempt
        # as TRAINROOM_CKPT_ROOT: the trainer's SDK, prune and resume all see this one root.
        keeper.options["ckpt_root"] = str(self.root)
        self.keep = int(keeper.options.get("keep") or keeper.config.checkpoints.keep)
        self.budget = keeper.options.get("disk_budget_bytes")
        self.globs = list(keeper.options.get("watch_ckpt") or keeper.config.checkpoints.watch)
        self.keep_copies = bool(keeper.options.get("keep_verified_copies"))
        self.verifier = WarmVerifier(idle_s=VERIFIER_IDLE_S)
        # /proc/mounts (DRVFS_CHECKPOINTS), under the keeper's proc root so a test can stage one.
        self.mounts_path = os.path.join(keeper.reclaim_roots()["proc_root"], "mounts")
        self.reports: dict[str, dict[str, Any]] = {}  # path -> the verdict of a rejected candidate
        self.deferred: dict[str, dict[str, Any]] = {}  # path -> a verdict that could not be reached yet
        self.saves: list[tuple[float, int]] = []  # (t, bytes) of each checkpoint that added a file
        self.usage: diskguard.DiskUsage | None = None
        self.mount: diskguard.MountEntry | None = None
        self.prunable: int | None = None
        self.watch_state = watch.WatchState()
        self.sightings: list[watch.Sighting] = []
        self.declared_arch: dict[str, Any] = {}
        self._jobs: dict[str, _Job] = {}
        self._verifying: frozenset[str] = frozenset()  # read from the probe thread: replaced, never mutated
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._started = False

    @property
    def verifying(self) -> frozenset[str]:
        """Paths queued or being verified: prune never touches them."""
        return self._verifying

    def writing(self) -> bool:
        """Whether a trainer is alive to write checkpoints (the disk projection needs one)."""
        proc = self.keeper.proc
        return proc is not None and proc.returncode is None

    # ------------------------------------------------------------------ records (loop thread)

    def observe(self, rec: Any) -> None:
        if not isinstance(rec, p.Received):
            return
        msg = rec.msg
        if isinstance(msg, p.Hello) and msg.config.arch:
            self.declared_arch = dict(msg.config.arch)
        elif isinstance(msg, p.Checkpoint):
            if msg.size_bytes:
                self._saved(rec.t, int(msg.size_bytes))
            self._schedule(msg.path)

    def _saved(self, t: float, size: int) -> None:
        self.saves.append((t, size))
        del self.saves[:-64]

    def _schedule(self, path: str, request: watch.VerifyRequest | None = None, tries: int = 0) -> None:
        key = path if request is None else f"{path}#{request.version}"
        if key in self._jobs:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        job = _Job(key=key, path=path, request=request, tries=tries)
        self._jobs[key] = job
        self._verifying = frozenset(j.path for j in self._jobs.values())
        self._queue.put_nowait(job)

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            try:
                await self._run(job)
            except Exception as exc:  # one bad job never stops the queue or the keeper
                self.keeper.emit(
                    p.KeeperNote(
                        t=time.time(),
                        kind="warning",
                        message=f"checkpoint {job.path}: {type(exc).__name__}: {exc}",
                    )
                )
            finally:
                self._jobs.pop(job.key, None)
                self._verifying = frozenset(j.path for j in self._jobs.values())
                self.keeper.journal.flush()

    def verify_now(
        self, path: str, expected: dict[str, Any] | None = None, timeout: float = 600.0
    ) -> dict[str, Any]:
        """Verify one file in the warm verifier (blocks: call it from a worker thread). For the
        keeper's `verify` action and the re-verification before a resume as well."""
        return self.verifier.verify(path, expected or None, timeout=timeout)

    async def _run(self, job: _Job) -> None:
        k = self.keeper
        if job.request is not None:
            await self._run_watched(job.request)
            return
        path = job.path
        own = _own_root(path)
        expected = await asyncio.to_thread(expected_for, own or self.root, self.declared_arch or None, path)
        step = expected.get("step")
        if step is None:
            c = k.state.checkpoint(path)
            step = c.step if c is not None else None
        k.emit(p.CheckpointState(path=path, step=step, state="verifying", t=time.time()))
        report = await asyncio.to_thread(self.verify_now, path, expected)
        if report.get("step") is None:
            report["step"] = step
        if report.get("deferred"):
            self.deferred[path] = report
            if job.tries + 1 < MAX_TRIES:
                asyncio.get_running_loop().call_later(RETRY_S, self._schedule, path, None, job.tries + 1)
        else:
            self.deferred.pop(path, None)
        if own is None:
            await self._settle_in_place(path, report)
            return
        try:
            rec = await asyncio.to_thread(settle, path, report, own)
        except Exception as exc:  # promotion failed: say so, keep the keeper
            rec = p.CheckpointState(
                path=path,
                step=step,
                state="rejected",
                t=time.time(),
                reason=f"could not settle: {type(exc).__name__}: {exc}",
            )
            report = {**report, "ok": False, "reason": rec.reason}
        k.emit(rec)
        self._remember(path, report, rec.state)

    async def _settle_in_place(self, path: str, report: dict[str, Any]) -> None:
        """A checkpoint the trainer announced outside quarantine is its own: verdict recorded,
        file left where it is, a verified copy promoted when asked."""
        ok, deferred = bool(report.get("ok")), bool(report.get("deferred"))
        state = "verified" if ok else "candidate" if deferred else "rejected"
        self.keeper.emit(
            p.CheckpointState(
                path=path,
                step=report.get("step"),
                state=state,
                t=time.time(),
                reason=report.get("reason"),
                size_bytes=report.get("size_bytes"),
                digest=report.get("digest"),
                report=_journal_report(report),
            )
        )
        self._remember(path, report, state)
        if ok and self.keep_copies:
            await self._keep_copy(path, report)

    def _remember(self, path: str, report: dict[str, Any], state: str) -> None:
        if state == "rejected":
            self.reports[path] = report
        else:
            self.reports.pop(path, None)

    async def _run_watched(self, request: watch.VerifyRequest) -> None:
        k = self.keeper
        report = await asyncio.to_thread(self.verify_now, request.path, dict(request.expected))
        current = await asyncio.to_thread(watch.stat_one, request.path)
        self.watch_state, recs, stood = watch.record_verdict(
            self.watch_state, request, report, current, time.time()
        )
        for r in recs:
            k.emit(r)
        if stood and report.get("ok") and self.keep_copies:
            await self._keep_copy(request.path, report)

    async def _keep_copy(self, path: str, report: dict[str, Any]) -> None:
        k = self.keeper
        try:
            target = await asyncio.to_thread(keep_verified_copy, path, report, self.root)
        except Exception as exc:  # ENOSPC, a vanished file: the verdict stands, the copy does not
            k.emit(
                p.KeeperNote(
                    t=time.time(),
                    kind="warning",
                    message=f"could not keep a verified copy of {path}: {type(exc).__name__}: {exc}",
                )
            )
            return
        if target is None:
            k.emit(p.KeeperNote(t=time.time(), message=f"{path} changed while it was copied: no copy kept"))
            return
        copy = target / Path(path).name
        size = copy.stat().st_size if copy.exists() else None
        if size:
            self._saved(time.time(), size)
        k.emit(
            p.CheckpointState(
                path=str(copy),
                step=report.get("step"),
                state="verified",
                t=time.time(),
                size_bytes=size,
                digest=report.get("digest"),
                report={"promoted_dir": str(target), "promoted_file": str(copy), "source": path},
            )
        )
        k.emit(p.KeeperNote(t=time.time(), message=f"kept a verified copy of {path} at {copy}"))

    def start(self) -> None:
        """At keeper start: finish what a previous keeper left half done, verify leftovers."""
        self._started = True
        try:
            Quarantine(self.root).sweep()
            leftovers = Quarantine(self.root).candidates()
        except OSError:
            leftovers = []
        for c in leftovers:
            self._schedule(str(c))

    # ------------------------------------------------------------------ probes (worker thread)

    def disk_sample(self) -> DiskSample:
        from trainroom.core.ops.prune import plan

        self.verifier.close_if_idle()
        try:
            if self.budget:
                usage = diskguard.budget_usage(self.root, int(self.budget))
            else:
                usage = diskguard.disk_usage(self.root)
            self.mount = diskguard.mount_of(self.root, diskguard.read_mounts(self.mounts_path))
            self.prunable = plan(self.root, self.keep, protect=list(self.verifying)).bytes_to_free
        except (OSError, ValueError) as exc:
            return DiskSample(path=str(self.root), error=str(exc))
        self.usage = usage
        if self.globs:
            self.sightings = watch.sight(self.globs, self.keeper.record.cwd)
        proj = diskguard.project(usage, list(self.saves), time.time())
        latest = None
        with contextlib.suppress(Exception):
            latest = str(latest_checkpoint(self.root) or "") or None
        return msgspec.structs.replace(
            usage.sample(self.mount),
            budget_bytes=self.budget,
            time_to_full_s=proj.time_to_full_s if proj is not None and self.writing() else None,
            prunable_bytes=self.prunable,
            latest=latest,
        )

    # ------------------------------------------------------------------ findings (loop thread)

    def findings(self, now: float) -> list[Finding]:
        if not self._started:
            self.start()
        k = self.keeper
        out: list[Finding] = []
        th = k.config.thresholds
        if self.usage is not None:
            out += diskguard.disk_findings(
                self.usage,
                self.mount,
                list(self.saves),
                now,
                th=th,
                prunable_bytes=self.prunable,
                writing=self.writing(),
            )
        # A rejection stays open until a newer checkpoint verifies.
        newest_ok = max((c.step or -1 for c in k.state.checkpoints if c.state == "verified"), default=-1)
        for path, rep in list(self.reports.items()):
            c = k.state.checkpoint(path)
            if c is None or c.state != "rejected" or ((c.step or -1) <= newest_ok and newest_ok >= 0):
                continue
            out += findings_for_report(rep)
        for path, rep in list(self.deferred.items()):
            ram = rep.get("ram") or {}
            low = host_ram_low(ram.get("mem_available"), int(ram.get("need_to_verify") or 0), path)
            if low is not None:
                out.append(low)
        if self.globs:
            self.watch_state, requests, recs = watch.poll(self.watch_state, self.sightings, now)
            for r in recs:
                k.emit(r)
            for req in requests:
                self._schedule(req.path, req)
            out += watch.watch_findings(self.watch_state)
        return out
