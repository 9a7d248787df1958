"""What a keeper holds, and the two ports it gives its parts (keeper.ports): `RunContext` (the run,
read; whether the trainer lives) and `Recorder` (fold, journal and send a record to every client).

The bottom of the keeper's layers (keeper.loop says which): each attribute below is assigned once,
in `keeper.loop.Keeper.__init__`, which builds the parts.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from trainroom.core.configuration.settings import RunSettings
from trainroom.core.health.guard import Fault
from trainroom.core.health.statedisk import StateDisk
from trainroom.core.journal.writer import JournalWriter
from trainroom.core.keeper import adopt
from trainroom.core.keeper.actions import Actions
from trainroom.core.keeper.batches import BatchWindow
from trainroom.core.keeper.logtail import LogTail
from trainroom.core.keeper.output import TrainerOutput
from trainroom.core.keeper.pipeline import CheckpointPipeline
from trainroom.core.keeper.recovery import AutoResume, Resumer
from trainroom.core.keeper.server import Server
from trainroom.core.keeper.supervision import Supervision
from trainroom.core.notify.alerts import Alerts
from trainroom.core.run import store as runs
from trainroom.core.run.state import RunState
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p


class KeeperParts:
    """The keeper's parts and state (assigned by keeper.loop.Keeper), as the RunContext and the
    Recorder its parts are given."""

    _run_dir: Path
    record: runs.RunRecord
    _settings: RunSettings
    view: RunView
    journal: JournalWriter[RunView]
    state_disk: StateDisk | None
    sock_path: Path
    _log_path: Path
    output: TrainerOutput
    proc: asyncio.subprocess.Process | adopt.Adopted | None
    attempt_n: int
    tail: LogTail
    stop_event: asyncio.Event
    idle_since: float | None
    wake: asyncio.Event
    active: asyncio.Event
    _ending: asyncio.Task[None] | None
    _finding_journaled: dict[str, float]
    _finding_sent: dict[str, float]
    supervision: Supervision
    pipeline: CheckpointPipeline
    batches: BatchWindow
    resumer: Resumer
    actions: Actions
    auto_resume: AutoResume | None
    server: Server
    alerts: Alerts

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

    def _journal_fault(self, f: Fault) -> None:
        """A guarded part raised: its traceback goes to the journal (first time, then at 10, 100...)."""
        text = f"{f.name} raised {f.error} (fault {f.count})\n{f.traceback}"
        self.emit(p.KeeperNote(t=f.last_t, message=text[-8000:], kind="internal-error"))
