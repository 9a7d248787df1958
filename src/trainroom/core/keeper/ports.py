"""The keeper's narrow ports: what its parts may ask of it, and nothing more.

The keeper is the event loop and owns the run (its state, journal, socket, child process). Its
parts (supervision, the checkpoint pipeline, actions, auto-resume) never see the Keeper object:
they get a `Recorder` to fold-and-journal records through, and a `RunContext` to read the run and
start an attempt. So every change to the run's state goes through a record (and `RunState.apply`),
and a part's dependencies are its constructor's arguments, so each part is tested with fakes of
those and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from trainroom.core.configuration.settings import RunSettings
from trainroom.core.run.state import RunState
from trainroom.core.wire import protocol as p


class Recorder(Protocol):
    """Folds a record into the run, journals it (unless told not to) and queues it for clients."""

    def emit(self, rec: p.Record, *, journal: bool = True) -> None: ...

    def flush(self, *, fsync: bool = False) -> None:
        """Push journaled records to the file (and to the disk with fsync)."""

    def note(self, message: str, kind: str = "info") -> None:
        """Journal a keeper note (a KeeperNote record) and flush."""


class RunContext(Protocol):
    """Read access to the run, and the one way to start an attempt of it."""

    @property
    def state(self) -> RunState:
        """The fold of every record so far. Read it; change it only through a Recorder."""

    @property
    def settings(self) -> RunSettings: ...

    @property
    def run_id(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def cwd(self) -> str: ...

    @property
    def argv(self) -> list[str]:
        """The command the run was launched with."""

    @property
    def log_path(self) -> Path: ...

    def trainer_alive(self) -> bool:
        """Whether the current attempt's process is running (not yet reaped)."""

    def trainer_python(self) -> str:
        """The trainer's interpreter (it has torch) when its command names one, else the keeper's."""

    async def start_attempt(
        self, argv: list[str] | None = None, resume_from: str | None = None, resume_step: int | None = None
    ) -> p.AttemptStarted | p.AttemptEnded:
        """Start the next attempt (the original argv when None); AttemptEnded if it could not start."""
