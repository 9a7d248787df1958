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

This module is its lifecycle: it builds the parts, starts the loops and closes it all. The rest is
in layers, each in its own module and each using only those below it: what it holds and the ports
it gives (keeper.parts), its verdicts (keeper.verdicts), its attempts (keeper.attempts), its tick
and probe loops (keeper.tick).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil

from trainroom.core.configuration import settings as settings_mod
from trainroom.core.configuration.config import Config, load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.health.statedisk import StateDisk
from trainroom.core.journal.writer import JournalWriter, hold_from_env
from trainroom.core.keeper import adopt, requeue, takeup
from trainroom.core.keeper.actions import Actions
from trainroom.core.keeper.batches import BatchWindow
from trainroom.core.keeper.foreground import Foreground
from trainroom.core.keeper.logtail import LogTail
from trainroom.core.keeper.output import TrainerOutput
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.recovery import AutoResume, Resumer
from trainroom.core.keeper.server import Server
from trainroom.core.keeper.supervision import Supervision
from trainroom.core.keeper.tick import Ticking
from trainroom.core.notify.alerts import Alerts
from trainroom.core.probes import procs
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol as p


def _load_config(rec: runs.RunRecord) -> tuple[Config, str | None]:
    """The run's trainroom.toml (project dir, then state dir); a bad one falls back to the
    defaults here, with a note: `launch` already refused it with exit 2 when it was given."""
    try:
        cfg, _path = load_config(rec.cwd, runs.state_dir())
        return cfg.resolved(rec.cwd), None
    except ConfigError as exc:
        return Config(), f"config ignored: {exc}"


class Keeper(Ticking):
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
