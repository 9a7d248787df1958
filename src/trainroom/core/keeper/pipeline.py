"""The keeper's side of checkpoints: every candidate the trainer announces (or a watched file an
uninstrumented trainer overwrites) is verified, then promoted or kept in quarantine; the disk
guard reads the checkpoint filesystem (or its byte budget) each probe cycle. The rules live in
checkpoints / verify / diskguard / checkpoint_watch / prune; this module schedules them and turns
their verdicts into records and findings.

Verification runs in one warm child process (`verifier.WarmVerifier`: torch imported once, reused
for every checkpoint, restarted if it dies, closed when idle), fed by one queue in arrival order:
a trainer that checkpoints every step gets each checkpoint verified in about the time it takes
to read it, and never more than one verification competes with it for the CPU. When checkpoints
are expected (`expecting`: watched globs, a configured root or resume template, a recognised
framework, or a first checkpoint seen) the child is started with the keeper and kept while the
trainer lives: on a loaded host its cold start at nice 10 took most of a minute, and a death
soon after a save then found "no verified checkpoint".

Thread model: `observe`, `findings` and the queue worker run on the keeper's loop thread (the
worker hands the blocking parts to a thread); `disk_sample` runs in the probe worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.ckpt import watch as watch
from trainroom.core.ckpt.layout import QUARANTINE, Quarantine, latest_checkpoint
from trainroom.core.ckpt.promote import expected_for, keep_verified_copy, settle
from trainroom.core.ckpt.report import Expected, VerifyReport, journal_report
from trainroom.core.ckpt.rules import findings_for_report
from trainroom.core.ckpt.verifier import WarmVerifier
from trainroom.core.configuration.settings import RunSettings
from trainroom.core.findings import Finding
from trainroom.core.health import diskguard as diskguard
from trainroom.core.health.host import host_ram_low
from trainroom.core.keeper.evalgate import EvalGate
from trainroom.core.keeper.ports import Recorder, RunContext
from trainroom.core.ops.prune import plan as prune_plan
from trainroom.core.samples import DiskSample
from trainroom.core.vocab import CkptState
from trainroom.core.wire import protocol as p

# A deferred verdict (verifier timed out or died, host RAM short) is tried again this much later,
# at most MAX_TRIES times in all; a leftover is tried again at the next keeper start.
RETRY_S = 30.0
MAX_TRIES = 3
# A watched path whose evaluation wrote into it (and was restored) is held still this long after:
# the sightings taken during the evaluation are older than what the watch absorbed.
STILL_AFTER_EVAL_S = 3.0
# Seconds the warm verifier may sit idle before it is closed (its torch holds ~150 MB), unless
# checkpoints are expected while the trainer lives.
VERIFIER_IDLE_S = 300.0
# Warm starts per keeper: a child that cannot start (no torch where the keeper runs) is not
# restarted each second; a checkpoint still starts it on demand.
WARM_STARTS = 3
# The note a trainer's `save_checkpoint` sends for a save it skipped (it would not fit).
SKIPPED_NOTE = diskguard.SKIPPED_NOTE
SKIPPED_KEPT = 4096


def expecting_checkpoints(settings: RunSettings, run_dir: Path) -> str | None:
    """Why this run is expected to write checkpoints (None: nothing says so yet)."""
    if settings.watch_globs:
        return "checkpoints are watched (" + ", ".join(settings.watch_globs) + ")"
    if Path(settings.ckpt_root) != run_dir / "checkpoints":
        return f"a checkpoint root is configured ({settings.ckpt_root})"
    if settings.resume_template:
        return "a resume template is set"
    # The framework `launch` recognised from the command (core/logs/frameworks), where it is known.
    recognised = getattr(settings, "recognised", None)
    if recognised is not None:
        return f"the command was recognised ({getattr(recognised, 'framework', 'a framework')})"
    return None


def _placement(path: str, root: Path) -> tuple[Path | None, str | None]:
    """Where an announced checkpoint sits: (our root, None) for a candidate in our quarantine,
    (None, None) for a file the trainer keeps elsewhere (verified where it is, never moved or
    written beside), (None, why) for anything the keeper must not touch: another root's
    quarantine, a symlink, a path that resolves out of our root. Paths are compared resolved."""
    candidate = Path(path)
    parent = candidate.parent
    if parent.name != QUARANTINE:
        return None, None
    if candidate.is_symlink():
        return None, f"{path} is a symbolic link in a quarantine: candidates are files the trainer wrote"
    real_root = os.path.realpath(root)
    if os.path.realpath(parent.parent) != real_root:
        return None, f"{path} is in the quarantine of {parent.parent}, not of this run's root {root}"
    if os.path.dirname(os.path.realpath(candidate)) != os.path.join(real_root, QUARANTINE):
        return None, f"{path} resolves outside {root}"
    return root, None


def outside_root(path: str, why: str) -> Finding:
    """CKPT_OUTSIDE_ROOT: an announced checkpoint the keeper refused to move, promote or write
    beside, because it is not inside this run's checkpoint root."""
    return Finding(
        code="CKPT_OUTSIDE_ROOT",
        severity="warning",
        key=path,
        message=f"checkpoint not handled: {why}; the keeper only creates, moves or deletes inside its root",
        evidence={"path": path, "why": why},
    )


def settling(state: watch.WatchState) -> bool:
    """A watched checkpoint still being written or settling (a non-empty version not yet judged),
    or being verified: a verdict is owed, so the keeper does not rest meanwhile. An empty file
    is never verified (`watch.poll`): it owes nothing."""
    return any(f.state == "verifying" or (f.state == "settling" and f.size > 0) for f in state.files.values())


class _Job(msgspec.Struct, kw_only=True):
    key: str
    path: str
    request: watch.VerifyRequest | None = None  # a watched file's version; None: an announced candidate
    tries: int = 0
    queued_at: float = msgspec.field(default_factory=time.time)
    started: bool = False
    # Announced again while it was being verified (a path saved over and over: Lightning's
    # last.ckpt, nanoGPT's ckpt.pt): the version verified may be an older one, so it runs again.
    again: bool = False


class CheckpointPipeline:
    def __init__(self, settings: RunSettings, recorder: Recorder, run: RunContext) -> None:
        self.recorder = recorder
        self.run = run
        self.settings = settings
        self.root = Path(settings.ckpt_root)
        self.still: dict[str, float] = {}  # watched paths held still until then (after an evaluation)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = settings.keep
        self.budget = settings.disk_budget_bytes
        self.globs = list(settings.watch_globs)
        self.keep_copies = settings.keep_verified_copies
        self.verifier = WarmVerifier(idle_s=VERIFIER_IDLE_S)
        self.expecting = expecting_checkpoints(settings, run.run_dir)
        self._warm_starts = 0
        self._warm_note: str | None = None
        # /proc/mounts (DRVFS_CHECKPOINTS), under the keeper's proc root so a test can stage one.
        self.mounts_path = os.path.join(settings.roots.proc, "mounts")
        self.reports: dict[str, VerifyReport] = {}  # path -> the verdict of a rejected candidate
        self.deferred: dict[str, VerifyReport] = {}  # path -> a verdict that could not be reached yet
        self.saves: list[tuple[float, int, int]] = []  # (t, bytes, step) of each checkpoint that added a file
        # The steps whose saves the trainer skipped since its last save (`save_checkpoint` refused:
        # they would not fit), the newest SKIPPED_KEPT of them; with their count.
        self.skipped: list[int] = []
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
        self.outside: dict[str, str] = {}  # path -> why the keeper would not touch it
        self.gate = EvalGate(settings, recorder, run)
        self.settled_at: float | None = None  # when the last queued checkpoint got its verdict

    @property
    def verifying(self) -> frozenset[str]:
        """Paths queued or being verified: prune never touches them."""
        return self._verifying

    def in_flight(self) -> list[tuple[str, float]]:
        """(path, since when) of every checkpoint queued or being verified, oldest first."""
        return sorted(((j.path, j.queued_at) for j in self._jobs.values()), key=lambda x: x[1])

    def settling(self) -> bool:
        """A watched checkpoint is still being written, settling or verified: see `settling`."""
        return settling(self.watch_state)

    async def wait_in_flight(self, bound_s: float, say: Callable[[str], None]) -> list[tuple[str, float]]:
        """A checkpoint saved just before a death may still be in the verifier: a resume waits for
        it (bounded, saying so) rather than resume from an older one or refuse. What is still in
        flight at the bound is returned."""
        deadline = time.monotonic() + bound_s
        said: set[str] = set()
        while (flight := self.in_flight()) and time.monotonic() < deadline:
            new = [path for path, _ in flight if path not in said]
            if new:
                said.update(new)
                say(f"waiting for the verification of {', '.join(new)} (up to {bound_s:.0f} s)")
            await asyncio.sleep(0.2)
        return self.in_flight()

    def _last_verified_step(self) -> int | None:
        last = self.run.state.last_verified()
        return last.step if last is not None else None

    def writing(self) -> bool:
        """Whether a trainer is alive to write checkpoints (the disk projection needs one)."""
        return self.run.trainer_alive()

    # ------------------------------------------------------------------ records (loop thread)

    def observe(self, rec: Any) -> None:
        if not isinstance(rec, p.Received):
            return
        msg = rec.msg
        if isinstance(msg, p.Hello) and msg.config.arch:
            self.declared_arch = dict(msg.config.arch)
        elif isinstance(msg, p.Note) and msg.kind == SKIPPED_NOTE and msg.step is not None:
            self.skipped.append(msg.step)  # a save the trainer skipped: it would not fit
            del self.skipped[:-SKIPPED_KEPT]
        elif isinstance(msg, p.Checkpoint):
            self.skipped.clear()  # saved again: nothing skipped since
            self.expecting = self.expecting or "the trainer saved a checkpoint"
            if msg.size_bytes:
                diskguard.record_save(self.saves, rec.t, int(msg.size_bytes), msg.step)
            self._schedule(msg.path)

    def _schedule(self, path: str, request: watch.VerifyRequest | None = None, tries: int = 0) -> None:
        key = path if request is None else f"{path}#{request.version}"
        if (queued := self._jobs.get(key)) is not None:
            queued.again = queued.again or queued.started  # one not started yet reads the newest
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
            job.started = True
            try:
                await self._run(job)
            except Exception as exc:  # one bad job never stops the queue or the keeper
                self.recorder.emit(
                    p.KeeperNote(
                        t=time.time(),
                        kind="warning",
                        message=f"checkpoint {job.path}: {type(exc).__name__}: {exc}",
                    )
                )
            finally:
                self._jobs.pop(job.key, None)
                self._verifying = frozenset(j.path for j in self._jobs.values())
                self.settled_at = time.time()
                self.recorder.flush()
                if job.again and os.path.exists(job.path):
                    self._schedule(job.path, job.request)

    def verify_now(self, path: str, expected: Expected | None = None, timeout: float = 600.0) -> VerifyReport:
        """Verify one file in the warm verifier (blocks: call it from a worker thread). For the
        keeper's `verify` action and the re-verification before a resume as well."""
        return self.verifier.verify(path, expected, timeout=timeout)

    async def _run(self, job: _Job) -> None:
        if job.request is not None:
            await self._run_watched(job.request)
            return
        path = job.path
        own, refused = _placement(path, self.root)
        if refused is not None:
            self.outside[path] = refused
            return
        expected = await asyncio.to_thread(expected_for, own or self.root, self.declared_arch or None, path)
        step = expected.step
        if step is None:
            c = self.run.state.checkpoint(path)
            step = c.step if c is not None else None
        self.recorder.emit(p.CheckpointState(path=path, step=step, state="verifying", t=time.time()))
        report = await asyncio.to_thread(self.verify_now, path, expected)
        if report.step is None:
            report = msgspec.structs.replace(report, step=step)
        if report.deferred:
            self.deferred[path] = report
            if job.tries + 1 < MAX_TRIES:
                asyncio.get_running_loop().call_later(RETRY_S, self._schedule, path, None, job.tries + 1)
        else:
            self.deferred.pop(path, None)
        figure = await self.gate.evaluate(path, report) if report.ok else None
        if figure is not None and not figure.passed:
            await self.gate.hold(path, report, figure, own)
            return
        if own is None:
            await self._settle_in_place(path, report, figure)
            return
        try:
            rec = await asyncio.to_thread(settle, path, report, own)
        except Exception as exc:  # promotion failed (a full disk): rolled back, tried again
            again = job.tries + 1 < MAX_TRIES
            if again:
                asyncio.get_running_loop().call_later(RETRY_S, self._schedule, path, None, job.tries + 1)
            rec = p.CheckpointState(
                path=path,
                step=step,
                state="rejected",
                t=time.time(),
                reason=f"verified, but not promoted: {type(exc).__name__}: {exc}"
                + (
                    f" (tried again in {RETRY_S:.0f} s)"
                    if again
                    else " (tried again at the next keeper start)"
                ),
            )
            report = msgspec.structs.replace(report, ok=False, reason=rec.reason)
        if rec.state == "candidate" and report.ok:
            job.again = True  # replaced after its verdict: the new bytes are verified in their turn
        if rec.state == "verified" and figure is not None:
            rec = msgspec.structs.replace(rec, eval=figure)
        self.recorder.emit(rec)
        self._remember(path, report, rec.state)

    async def _settle_in_place(
        self, path: str, report: VerifyReport, figure: p.EvalFigure | None = None
    ) -> None:
        """A checkpoint the trainer announced outside quarantine is its own: verdict recorded,
        file left where it is, a verified copy promoted when asked."""
        ok, deferred = report.ok, report.deferred
        state: CkptState = "verified" if ok else "candidate" if deferred else "rejected"
        self.recorder.emit(
            p.CheckpointState(
                path=path,
                step=report.step,
                state=state,
                t=time.time(),
                reason=report.reason,
                size_bytes=report.size_bytes,
                digest=report.digest,
                report=journal_report(report),
                eval=figure,
            )
        )
        self._remember(path, report, state)
        if ok and self.keep_copies:
            await self._keep_copy(path, report, figure)

    def _remember(self, path: str, report: VerifyReport, state: CkptState) -> None:
        if state == "rejected":
            self.reports[path] = report
        else:
            self.reports.pop(path, None)

    async def _run_watched(self, request: watch.VerifyRequest) -> None:
        report = await asyncio.to_thread(self.verify_now, request.path, request.expected)
        current = await asyncio.to_thread(watch.stat_one, request.path)
        self.watch_state, recs, stood = watch.record_verdict(
            self.watch_state, request, report, current, time.time()
        )
        for r in recs:
            self.recorder.emit(r)
        if stood:
            self.watch_state, said = watch.unverified_note(self.watch_state, request.path)
            if said:
                self.recorder.note(said, kind="warning")
        figure = await self.gate.evaluate(request.path, report, watched=True) if stood and report.ok else None
        if figure is not None and self.gate.restored:  # no await since the evaluation: the watch held still
            self.watch_state = watch.absorb(self.watch_state, request.path, request.version, self.gate.after)
            self.still[request.path] = time.time() + STILL_AFTER_EVAL_S  # sightings taken during it
        if figure is not None:
            # The trainer's own file (nanoGPT's out/ckpt.pt) is gated like a saved one: held back
            # (no verified copy kept) or verified with its figure.
            if not figure.passed:
                await self.gate.hold(request.path, report, figure, None)
                return
            self.recorder.emit(msgspec.structs.replace(recs[-1], eval=figure, t=time.time()))
        if stood and report.ok and self.keep_copies:
            await self._keep_copy(request.path, report, figure)

    async def _keep_copy(self, path: str, report: VerifyReport, figure: p.EvalFigure | None = None) -> None:
        try:
            target = await asyncio.to_thread(keep_verified_copy, path, report, self.root)
        except Exception as exc:  # ENOSPC, a vanished file: the verdict stands, the copy does not
            self.recorder.emit(
                p.KeeperNote(
                    t=time.time(),
                    kind="warning",
                    message=f"could not keep a verified copy of {path}: {type(exc).__name__}: {exc}",
                )
            )
            return
        if target is None:
            self.recorder.emit(
                p.KeeperNote(t=time.time(), message=f"{path} changed while it was copied: no copy kept")
            )
            return
        copy = target / Path(path).name
        size = copy.stat().st_size if copy.exists() else None
        if size:
            # When the trainer wrote it (a copy is made later, and a resumed run's keeper copies
            # what was there in a burst): the cadence is the trainer's.
            try:
                written = Path(path).stat().st_mtime
            except OSError:  # gone since (HF's save_total_limit): the copy's time
                written = time.time()
            diskguard.record_save(self.saves, written, size, report.step or 0)
        self.recorder.emit(
            p.CheckpointState(
                path=str(copy),
                step=report.step,
                state="verified",
                t=time.time(),
                size_bytes=size,
                digest=report.digest,
                report=p.CheckpointReport(
                    ok=True,
                    promoted_dir=str(target),
                    promoted_file=str(copy),
                    source=path,
                    completeness=report.completeness,
                ),
                eval=figure,
            )
        )
        self.recorder.emit(p.KeeperNote(t=time.time(), message=f"kept a verified copy of {path} at {copy}"))

    def start(self) -> None:
        """At keeper start: finish what a previous keeper left half done, verify leftovers."""
        self._started = True
        q = Quarantine(self.root)
        refused = q.unsafe()
        if refused is not None:
            self.outside[str(q.dir)] = refused
        try:
            q.sweep()
            leftovers = q.candidates()
        except OSError:
            leftovers = []
        for c in leftovers:
            self._schedule(str(c))

    # ------------------------------------------------------------------ probes (worker thread)

    def _keep_warm(self) -> None:
        """Probe thread: the verifier started (and restarted) while checkpoints are expected and
        the trainer lives; closed after VERIFIER_IDLE_S idle otherwise."""
        if not (self.expecting and self.writing()):
            self.verifier.close_if_idle()
            return
        if self._warm_starts < WARM_STARTS and self.verifier.warm():
            self._warm_starts += 1
            # Journaled from the loop thread (`findings`): the recorder is not this thread's.
            self._warm_note = f"checkpoint verifier started warm: {self.expecting}"

    def disk_sample(self) -> DiskSample:
        self._keep_warm()
        try:
            if self.budget:
                usage = diskguard.budget_usage(self.root, int(self.budget))
            else:
                usage = diskguard.disk_usage(self.root)
            self.mount = diskguard.mount_of(self.root, diskguard.read_mounts(self.mounts_path))
            self.prunable = prune_plan(
                self.root, self.keep, protect=list(self.verifying), check_digests=False
            ).bytes_to_free
        except (OSError, ValueError) as exc:
            return DiskSample(path=str(self.root), error=str(exc))
        self.usage = usage
        if self.globs:
            self.sightings = watch.sight(self.globs, self.run.cwd)
            if self.sightings:
                self.expecting = self.expecting or "the trainer saved a checkpoint"
        proj = diskguard.project(usage, [(t, size) for t, size, _ in self.saves], time.time())
        latest = None
        with contextlib.suppress(Exception):
            latest = str(latest_checkpoint(self.root) or "") or None
        fs = None
        if self.budget:
            with contextlib.suppress(OSError):
                fs = diskguard.disk_usage(self.root)
        return msgspec.structs.replace(
            usage.sample(self.mount),
            fs_used_fraction=round(fs.used_fraction, 4) if fs is not None else None,
            fs_free_bytes=fs.free_bytes if fs is not None else None,
            budget_bytes=self.budget,
            time_to_full_s=proj.time_to_full_s if proj is not None and self.writing() else None,
            prunable_bytes=self.prunable,
            latest=latest,
        )

    # ------------------------------------------------------------------ findings (loop thread)

    def findings(self, now: float) -> list[Finding]:
        if not self._started:
            self.start()
        note, self._warm_note = self._warm_note, None
        if note:
            self.recorder.note(note)
        out: list[Finding] = []
        th = self.settings.thresholds
        if self.usage is not None:
            out += diskguard.disk_findings(
                self.usage,
                self.mount,
                [(t, size) for t, size, _ in self.saves],
                now,
                th=th,
                prunable_bytes=self.prunable,
                writing=self.writing(),
                skipped=diskguard.Skipped(
                    steps=tuple(self.skipped), last_verified_step=self._last_verified_step()
                ),
            )
        # A rejection stays open until a newer checkpoint verifies.
        newest_ok = max(
            (c.step or -1 for c in self.run.state.checkpoints if c.state == "verified"), default=-1
        )
        last = self.run.state.last_verified()
        verified = (
            (f"step {last.step}" if last.step is not None else os.path.basename(last.path)) if last else None
        )
        for path, rep in list(self.reports.items()):
            c = self.run.state.checkpoint(path)
            if c is None or c.state != "rejected" or ((c.step or -1) <= newest_ok and newest_ok >= 0):
                continue
            out += findings_for_report(rep, verified)
        for path, rep in list(self.deferred.items()):
            ram = rep.ram
            low = host_ram_low(ram.mem_available, ram.need_to_verify, path) if ram is not None else None
            if low is not None:
                out.append(low)
        out += [outside_root(path, why) for path, why in list(self.outside.items())[-8:]]
        out += self.gate.findings(newest_ok)
        if self.globs:
            self.still = {k: t for k, t in self.still.items() if t > now}
            held = [*self.still, *([self.gate.evaluating] if self.gate.evaluating else [])]
            seen = watch.held_still(self.watch_state, self.sightings, held)
            a = self.run.state.attempt
            step = a.last_step if a is not None else None
            self.watch_state, requests, recs = watch.poll(self.watch_state, seen, now, step=step)
            for r in recs:
                self.recorder.emit(r)
            for req in requests:
                self._schedule(req.path, req)
            out += watch.watch_findings(self.watch_state)
        return out
