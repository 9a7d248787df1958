"""The keeper: owns one run, outlives the shell that launched it, and is its one source of truth.

It runs in its own session (the launcher setsid()s it), starts each attempt of the trainer as its
child in a new process group with stdin on /dev/null and stdout+stderr appended to trainer.log,
waits on it (so the exit code or signal is known the moment it dies), takes telemetry frames from
the trainer's reporter, probes the host each second, runs the watchdog, journals everything that
matters and serves any number of clients: a snapshot on connect, then live deltas.

The keeper is the event loop and the only owner of the run's state: its parts (supervision, the
checkpoint pipeline, actions, auto-resume) get narrow ports (keeper.ports) and services, never
the Keeper. It imports neither torch nor textual: verification and the bench run in child
processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trainroom.core import protocol as p
from trainroom.core import settings as settings_mod
from trainroom.core.config import Config, load_config
from trainroom.core.findings import Finding
from trainroom.core.health.guard import Fault
from trainroom.core.health.rules import KeeperFacts
from trainroom.core.health.statedisk import StateDisk
from trainroom.core.health.statedisk import observe as observe_state_disk
from trainroom.core.journal.writer import JournalWriter, hold_from_env
from trainroom.core.keeper import adopt, requeue, takeup
from trainroom.core.keeper.actions import Actions
from trainroom.core.keeper.batches import BatchWindow
from trainroom.core.keeper.foreground import Foreground
from trainroom.core.keeper.logtail import LogTail
from trainroom.core.keeper.output import TrainerOutput, log_line
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.recovery import AutoResume, Resumer
from trainroom.core.keeper.rest import AWAKE_NOTE, REST_NOTE, Quiet, linger_verdict, rest_wait, why_awake
from trainroom.core.keeper.server import Server
from trainroom.core.keeper.supervision import Supervision
from trainroom.core.keeper.workers import crash_rank, log_rank
from trainroom.core.notify.alerts import Alerts
from trainroom.core.probes import procs
from trainroom.core.probes.procs import pid_alive
from trainroom.core.run import store as runs
from trainroom.core.run.state import RunState
from trainroom.core.samples import HostSample
from trainroom.core.sdk.lr import requested_from_argv
from trainroom.core.sections import ConfigError
from trainroom.core.settings import RunSettings
from trainroom.core.vocab import StateName

TICK_S = 0.1  # watchdog cadence: DEAD is raised by the child's exit, the rest within a tick
PROBE_S = 1.0
FINDING_REJOURNAL_S = 10.0
FINDING_REFRESH_S = 1.0
FLOOR_WAIT_S = 5.0  # the longest an attempt's start waits to read the devices' memory floor


def _load_config(rec: runs.RunRecord) -> tuple[Config, str | None]:
    """The run's trainroom.toml (project dir, then state dir); a bad one falls back to the
    defaults here, with a note: `launch` already refused it with exit 2 when it was given."""
    try:
        cfg, _path = load_config(rec.cwd, runs.state_dir())
        return cfg.resolved(rec.cwd), None
    except ConfigError as exc:
        return Config(), f"config ignored: {exc}"


class Keeper:
    """One run's keeper: the Recorder and RunContext its parts are given (keeper.ports)."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        self.record = runs.read_record(run_dir)
        rec = self.record
        config, note = _load_config(rec)
        self._settings = settings_mod.resolve(
            rec.options, config, cwd=rec.cwd, run_dir=run_dir, env=os.environ, config_note=note, argv=rec.argv
        )
        self.record.ckpt_root = self._settings.ckpt_root
        # A run whose keeper died goes on from its journal (keeper.takeup).
        self.view = takeup.prior_view(run_dir, rec) or runs.empty_view(rec)
        # Batches steps, writes snapshots, summary and segments (journal.writer); the file is journal.file's.
        self.journal = JournalWriter(run_dir, runs.fold_of(rec), self._settings.journal, hold=hold_from_env())
        self.state_disk: StateDisk | None = None
        self.sock_path = run_dir / runs.SOCKET_NAME
        self._log_path = run_dir / runs.LOG_NAME
        # The trainer's stdout/stderr reach trainer.log through a pump: no write error reaches it.
        # An attached run's trainer.log is trainroom's own link to the trainer's log (run.attach):
        # a takeover's attempts write to that file by the path its record names, never through a link.
        attached_log = rec.attached.log if rec.attached is not None else None
        self.output = TrainerOutput(Path(attached_log) if attached_log else self._log_path, self.note)
        self.proc: asyncio.subprocess.Process | adopt.Adopted | None = None
        self.attempt_n = 0
        self.tail = LogTail(self._log_path, self._settings.log_pattern, self._settings.log_hints)
        self.stop_event = asyncio.Event()
        self.idle_since: float | None = None
        # Resting (keeper.rest): `wake` is set by whatever can change the run and wakes the tick
        # loop; `active` is clear while the keeper rests, and the probe loop slows down then.
        self.wake = asyncio.Event()
        self.active = asyncio.Event()
        self.active.set()
        self._ending: asyncio.Task[None] | None = None
        self._finding_journaled: dict[str, float] = {}
        self._finding_sent: dict[str, float] = {}
        if self._settings.fake_nvml:
            # The demo's GPU faults on a machine without one: the trainer writes the scenario the
            # keeper's fake NVML reads (see probes/fake_nvml.py); both inherit this variable.
            os.environ["TRAINROOM_FAKE_NVML"] = str(run_dir / "fake-nvml.json")
        self.supervision = Supervision(self._settings, run=self, recorder=self, on_fault=self._journal_fault)
        self.pipeline = CheckpointPipeline(self._settings, recorder=self, run=self)
        self.batches = BatchWindow()
        self.resumer = Resumer(self, self.pipeline, self.supervision.gpu)
        self.actions = Actions(self, self, self.pipeline, self.resumer, self.supervision.gpu)
        self.auto_resume = (
            AutoResume(self, self, self.resumer, self.supervision.thresholds)
            if self._settings.auto_resume > 0
            else None
        )
        self.server = Server(self, self.actions)
        self.server.changed = self.wake.set
        # Alerts observe what is emitted and deliver off the loop (core/notify); `notify --test`
        # reaches them as an action.
        self.alerts = Alerts.for_run(self._settings.notify, cwd=rec.cwd, sink=self, state=lambda: self.state)
        self.actions.handlers["notify-test"] = self.alerts.test_action

    # ------------------------------------------------------------------ RunContext

    @property
    def state(self) -> RunState:
        return self.view.state

    @property
    def settings(self) -> RunSettings:
        return self._settings

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    @property
    def cwd(self) -> str:
        return self.record.cwd

    @property
    def argv(self) -> list[str]:
        return list(self.record.argv)

    @property
    def log_path(self) -> Path:
        return self._log_path

    def trainer_alive(self) -> bool:
        # Until its last output is in trainer.log, an attempt that just ended is judged as it was.
        ending = self.attempt_n in self.output.ending
        return self.proc is not None and (self.proc.returncode is None or ending)

    def adopt_child(self, handle: adopt.Adopted) -> None:
        self.proc = handle  # an attached run's trainer, watched through a pidfd (keeper.adopt)

    def trainer_python(self) -> str:
        argv = self.record.argv
        if argv and "python" in os.path.basename(argv[0]):
            return argv[0]
        return sys.executable

    # ------------------------------------------------------------------ Recorder

    def emit(self, rec: p.Record, *, journal: bool = True) -> None:
        """Fold a record into the run, journal it, and queue it for every live client."""
        g = self.supervision.guard
        g.call("run.fold", lambda: self.view.apply(rec), None)
        self.supervision.observe(rec)
        g.call("checkpoints.observe", lambda: self.pipeline.observe(rec), None)
        g.call("batches.observe", lambda: self.batches.observe(rec), None)
        g.call("alerts.observe", lambda: self.alerts.observe(rec), None)
        if journal:
            self.journal.append(rec)
        self.server.queue(rec)
        self.wake.set()

    def flush(self, *, fsync: bool = False) -> None:
        self.journal.flush(fsync=fsync)

    def snapshot(self) -> p.Snapshot:
        return self.view.to_snapshot()

    def note(self, message: str, kind: str = "info") -> None:
        self.emit(p.KeeperNote(t=time.time(), message=message, kind=kind))
        self.flush()

    # ------------------------------------------------------------------ verdicts

    def set_findings(self, found: list[Finding], now: float) -> None:
        """Raise what is new, refresh what stays, clear what the rules no longer return."""
        current = self.state.findings
        seen: set[str] = set()
        for f in found:
            seen.add(f.ident)
            self._refresh(f, current.get(f.ident), now)
        for ident in [i for i in current if i not in seen]:
            self._finding_journaled.pop(ident, None)
            self._finding_sent.pop(ident, None)
            self.emit(p.FindingCleared(ident=ident, t=now))

    def _refresh(self, f: Finding, old: Finding | None, now: float) -> None:
        ident = f.ident
        if old is None:
            f.first_seen = f.first_seen or now
            f.last_seen = now
            self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f))
            log = self.supervision.guard.call(
                "batches.raised", lambda: self.batches.raised(f, self.attempt_n), None
            )
            if log is not None:
                self.emit(log)
            return
        f.first_seen, f.last_seen = old.first_seen, now
        if old.severity != f.severity:
            self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f))
        elif old.message != f.message:
            # Live figures in a message reach clients at once, the journal at most every
            # FINDING_REJOURNAL_S: a day of NaN steps must not write a record per tick.
            due = now - self._finding_journaled.get(ident, 0.0) >= FINDING_REJOURNAL_S
            if due:
                self._finding_journaled[ident] = now
            self.emit(p.FindingRaised(finding=f), journal=due)
        elif old.evidence != f.evidence and now - self._finding_sent.get(ident, 0.0) >= FINDING_REFRESH_S:
            # Same words, moving figures (a growing gap, a ratio): clients get them live, at most
            # once a second, and the journal keeps the words.
            self._finding_sent[ident] = now
            self.emit(p.FindingRaised(finding=f), journal=False)

    def set_status(self, state: StateName, reason: str, now: float) -> None:
        if (state, reason) != (self.state.status, self.state.status_reason):
            self.emit(p.RunStatus(t=now, state=state, reason=reason))

    def evaluate(self, now: float) -> None:
        """Every rule through the supervision's guard (`health.rules`): one that raises is an
        INTERNAL_ERROR finding, and the state and every other finding still come out."""
        state, reason, found = self.supervision.evaluate(now)
        facts = self.supervision.guard.call("keeper.facts", self._keeper_facts, None)
        if facts is not None:
            found += self.supervision.keeper_findings(facts, now)
        found += self.supervision.findings(now)
        self.set_status(state, reason, now)
        self.set_findings(found, now)

    def _keeper_facts(self) -> KeeperFacts:
        """What the keeper's own rules read of it, gathered here on the loop thread."""
        return KeeperFacts(
            run=self.state,
            thresholds=self._settings.thresholds,
            journal=self.journal.health,
            journal_where=str(self._run_dir),
            journal_backlog_bytes=self.journal.backlog_bytes,
            state_disk=self.state_disk,
            live_claims=[
                (c.attempt, c.rank, c.owner_pid, c.claimant_pid)
                for c in self.server.rank_claims
                if pid_alive(c.claimant_pid)
            ],
            refused_fields=self._refused_fields(),
            checkpoints=self.pipeline.findings,
        )

    def _refused_fields(self) -> list[tuple[int, int, str, str, str, bool, int]]:
        return [
            (r.attempt, r.rank, r.field, r.value, r.reason, r.whole_frame, r.count)
            for r in self.server.refused_fields.values()
        ]

    def _journal_fault(self, f: Fault) -> None:
        """A guarded part raised: its traceback goes to the journal (first time, then at 10, 100...)."""
        text = f"{f.name} raised {f.error} (fault {f.count})\n{f.traceback}"
        self.emit(p.KeeperNote(t=f.last_t, message=text[-8000:], kind="internal-error"))

    # ------------------------------------------------------------------ attempts

    def _attempt_env(self, n: int, resume_from: str | None) -> dict[str, str]:
        env = adopt.base_env(self.record)  # an attached run's takeover: its own environment
        env.update(
            {
                "TRAINROOM_SOCKET": str(self.sock_path),
                "TRAINROOM_RUN": self.record.run_id,
                "TRAINROOM_RUN_DIR": str(self._run_dir),
                "TRAINROOM_ATTEMPT": str(n),
                "PYTHONUNBUFFERED": "1",
                # The one root the trainer's SDK, prune and resume all see.
                settings_mod.ENV_CKPT_ROOT: self._settings.ckpt_root,
            }
        )
        if self._settings.disk_budget_bytes:
            # The SDK's pre-save check refuses a checkpoint the budget cannot take.
            env["TRAINROOM_DISK_BUDGET"] = str(self._settings.disk_budget_bytes)
        if resume_from:
            env["TRAINROOM_RESUME"] = resume_from
        else:
            env.pop("TRAINROOM_RESUME", None)
        return env

    async def start_attempt(
        self, argv: list[str] | None = None, resume_from: str | None = None, resume_step: int | None = None
    ) -> p.AttemptStarted | p.AttemptEnded:
        self.attempt_n += 1
        n = self.attempt_n
        argv = argv or list(self.record.argv)
        env = self._attempt_env(n, resume_from)
        # The devices' memory with nothing of this attempt on it: where the driver gives no
        # per-process memory, a kill judges the release against it (sample() never raises; a
        # wedged driver call must not hold the launch, so it gets a few seconds).
        try:
            floor = await asyncio.wait_for(asyncio.to_thread(self.supervision.gpu.floor), FLOOR_WAIT_S)
        except TimeoutError:
            floor = None
        now = time.time()
        out = await self.output.open(n)
        with self.output.log_file() as log:
            log_line(log, f"attempt {n} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}")
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log if out is None else out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.record.cwd,
                    env=env,
                    process_group=0,
                )
            except OSError as exc:
                log_line(log, f"could not start: {exc}")
                return self._could_not_start(n, now, argv, resume_from, exc)
            finally:
                if out is not None:
                    os.close(out)  # the trainer holds it now: the pipe ends when the trainer's side does
        try:
            start_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            start_time = now
        self.proc = proc
        started = p.AttemptStarted(
            n=n,
            t=now,
            pid=proc.pid,
            pgid=proc.pid,
            start_time=start_time,
            start_ticks=procs.start_ticks(proc.pid),
            argv=argv,
            cwd=self.record.cwd,
            resume_from=resume_from,
            resume_step=resume_step,
            requested=requested_from_argv(argv),
            vram_floor=floor,
        )
        self.emit(started)
        self.flush()
        self._ending = asyncio.get_running_loop().create_task(self._wait_attempt(n, proc))
        return started

    def _could_not_start(
        self, n: int, now: float, argv: list[str], resume_from: str | None, exc: OSError
    ) -> p.AttemptEnded:
        started = p.AttemptStarted(
            n=n, t=now, pid=0, pgid=0, start_time=0.0, argv=argv, cwd=self.record.cwd, resume_from=resume_from
        )
        self.emit(started)
        ended = p.AttemptEnded(n=n, t=time.time(), exit_code=127, error=f"could not start: {exc}")
        self.emit(ended)
        self.flush()
        return ended

    async def _wait_attempt(self, n: int, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        await self.attempt_over(
            n,
            proc,
            lambda t: p.AttemptEnded(
                n=n, t=t, exit_code=rc if rc >= 0 else None, exit_signal=-rc if rc < 0 else None
            ),
        )

    async def attempt_over(self, n: int, proc: object, ended_of: Callable[[float], p.AttemptEnded]) -> None:
        """An attempt's process has ended (waited for, or an adopted one's pidfd): judge it."""
        now = time.time()
        await self.output.drained(n)  # the last lines (a traceback) are in trainer.log
        g = self.supervision.guard
        # Read what the trainer wrote last before calling it: a traceback there is the cause.
        g.call("keeper.read_log", lambda: self._read_log(now, final=True), None)
        ended = ended_of(now)
        self.emit(ended)
        a = self.state.attempt
        if a is not None and a.n == n and ended.exit_code != 0 and a.crash is None:
            lines = self.tail.cause_lines(a.last_step_t)  # a traceback before the last step is not it
            crash = g.call(
                "log reader.crash", lambda: self.supervision.crash_from_log("\n".join(lines)), None
            )
            if crash is not None:
                self.emit(p.Received(attempt=n, rank=crash_rank(self.state, lines, now), t=now, msg=crash))
        self.flush(fsync=True)
        if self.proc is proc:
            self.proc = None
        g.call("keeper.evaluate", lambda: self.evaluate(now), None)
        g.call("server.flush", self.server.flush, None)
        if self.auto_resume is not None:
            await self.auto_resume.attempt_ended(ended)

    # ------------------------------------------------------------------ loops

    def _read_log(self, now: float, final: bool = False) -> None:
        a = self.state.attempt
        rank = log_rank(self.state, now)
        if rank is None and not final and a is not None and not a.instrumented:
            return  # a launcher's ranks not found yet: its lines are read once they are
        n, exact = (a.n, a.instrumented) if a is not None else (None, False)
        no: list[p.Record] = []
        recs = self.supervision.guard.call(
            "log reader", lambda: self.tail.collect(now, n, exact, rank or 0, final), no
        )
        for rec in recs:
            self.emit(rec)

    async def tick_loop(self) -> None:
        while not self.stop_event.is_set():
            now = time.time()
            self._tick(now)
            if self.stop_event.is_set():
                return
            # Guarded like the tick: a rest decision that raises is a fault, never the loop's end.
            failed: str | None = "the rest check failed"
            why = self.supervision.guard.call("keeper.rest", self._awake_why, failed)
            if why is None:
                await self._rest(now)
                continue
            if not self.active.is_set():
                self.active.set()
                self.note(AWAKE_NOTE + why)
            await asyncio.sleep(TICK_S)

    def quiet(self) -> Quiet:
        pipe, a = self.pipeline, self.state.attempt
        return Quiet(
            trainer=self.trainer_alive() or (a is not None and a.alive),
            ending=self._ending is not None and not self._ending.done(),
            acting=self.actions.busy,
            verifying=bool(pipe.in_flight()) or pipe.settling(),
        )

    def _awake_why(self) -> str | None:
        """None: the keeper may rest (keeper.rest); else why it may not, in words."""
        a, codes = self.state.attempt, [f.code for f in self.state.findings.values()]
        ended = a.ended_at if a is not None else None
        return why_awake(self.quiet(), ended, self.state.probe, codes, self.pipeline.settled_at)

    async def _rest(self, now: float) -> None:
        """A tick after each slow probe, or sooner when something can change the run, or when
        the linger is over."""
        rest_s = self._settings.rest_probe_s
        if self.active.is_set():
            self.active.clear()
            self.emit(p.KeeperNote(t=now, message=REST_NOTE.format(rest=rest_s, linger=self._linger_s())))
            g = self.supervision.guard
            g.call("server.flush", self.server.flush, None)
            g.call("journal.flush", self.flush, None)
            # `runs` and the picker read the ended run at once.
            g.call("journal.summary", self.journal.write_summary, None)
        self.wake.clear()
        viewers, others = self.server.has_viewers(), self.server.has_clients()
        timeout = rest_wait(rest_s, self._linger_s(), self.idle_since, now, viewers=viewers, others=others)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    def _tick(self, now: float) -> None:
        """Each step guarded on its own: nothing that raises may end the loop that sees deaths."""
        g = self.supervision.guard
        g.call("keeper.read_log", lambda: self._read_log(now), None)
        g.call("keeper.evaluate", lambda: self.evaluate(now), None)
        g.call("server.tick", lambda: self.server.tick(now), None)
        g.call("server.flush", self.server.flush, None)
        g.call("journal.flush", self.flush, None)
        g.call("keeper.linger", lambda: self._check_linger(now), None)

    async def probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            try:
                targets = self.supervision.targets()
                sample = await loop.run_in_executor(None, self._probe, targets)
            except Exception as exc:  # a probe must never take the keeper down
                now = time.time()
                why = f"host probe failed: {type(exc).__name__}: {exc}"
                sample = p.ProbeSample(t=now, host=HostSample(t=now, available=False, reason=why))
            self.emit(sample, journal=False)
            # Re-arm only after the previous probe ended, so probes never overlap; a resting
            # keeper probes every rest_probe_s, and at once when it stops resting.
            resting = not self.active.is_set()
            left = max(0.05, (self._settings.rest_probe_s if resting else PROBE_S) - (time.monotonic() - t0))
            if not resting:
                await asyncio.sleep(left)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.active.wait(), left)

    def _probe(self, targets: object) -> p.ProbeSample:
        """One probe cycle (worker thread): the sweep, then the checkpoint disk."""
        from trainroom.core.probes.sweep import ProbeTargets

        assert isinstance(targets, ProbeTargets)
        sample = self.supervision.probe(targets)
        sample.disk = self.pipeline.disk_sample()
        budget = bool(self._settings.disk_budget_bytes)
        try:
            self.state_disk = observe_state_disk(
                self._run_dir, self.journal.usage(), self._settings.ckpt_root, budget, self.output.loss
            )
        except OSError:
            self.state_disk = None
        return sample

    def _linger_s(self) -> float:
        """A run whose trainer died waits longer for its resume (resting, it costs little)."""
        return self._settings.dead_linger_s if self.state.status == "dead" else self._settings.linger_s

    def _check_linger(self, now: float) -> None:
        if not self.quiet().idle or self.server.has_viewers():
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        why = linger_verdict(self, now)
        if why is not None:
            self.emit(p.KeeperNote(t=now, message=why))
            self.stop_event.set()

    # ------------------------------------------------------------------ main

    def _name_self(self) -> psutil.Process:
        """The record names this keeper (and the checkpoint root it resolved) before the socket
        appears: `launch` returns on the socket, and a reader in between would take the run for
        one whose keeper is gone."""
        me = psutil.Process()
        self.record.keeper_pid, self.record.keeper_start_time = me.pid, me.create_time()
        self.record.keeper_start_ticks = procs.start_ticks(me.pid)
        runs.write_record(self._run_dir, self.record)
        return me

    async def main(self) -> int:
        await self.server.listen(self.sock_path, before_publish=self._name_self)
        loop = asyncio.get_running_loop()
        Foreground(self, self.record.options).install(loop)  # SIGTERM, SIGINT: see keeper/foreground.py
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        self.emit(
            p.KeeperStarted(
                t=time.time(),
                pid=os.getpid(),
                start_ticks=self.record.keeper_start_ticks,
                thresholds=self._settings.thresholds,
                resume_template=self._settings.resume_template,
                resume_template_from=self._settings.resume_template_from,
            )
        )
        if self._settings.config_note:
            self.emit(p.KeeperNote(t=time.time(), message=self._settings.config_note, kind="warning"))
        if self.state.attempt is not None and requeue.pending(self.record.options):
            self._ending = requeue.take_up(self)  # a requeued Slurm job's run, one attempt later
        elif self.state.attempt is not None:
            self._ending = takeup.take_up(self, self.state.attempt)  # the run's keeper had died
        elif self.record.attached is not None:
            self._ending = adopt.begin(self, self.record.attached)  # a trainer it did not start
        else:
            first = self.record.options  # a requeued Slurm job's next attempt resumes (keeper/foreground.py)
            await self.start_attempt(resume_from=first.resume_from, resume_step=first.resume_step)
        tasks = [loop.create_task(self.tick_loop()), loop.create_task(self.probe_loop())]
        await self.stop_event.wait()
        adopt.detach(self)
        for t in tasks:
            t.cancel()
        await self.server.close()
        self.supervision.close()
        self.output.close()
        await self.alerts.close()
        self.journal.close()
        return 0
