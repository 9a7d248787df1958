"""A Slurm job, followed: the job screen's source for `trainroom job slurm:JOBID --tui`.

One thread reads the job (`read_slurm_job`: scontrol through the reader's cache, one srun step
across the nodes) at most every `interval_s` — never more often than the reader lets slurmctld be
asked (3 s) — and keeps the last answer. The screen redraws from it as often as it likes: the
readings as last heard, and Slurm's view computed by core (`slurm_view`) against the screen's
clock, so a requeued job's eligibility countdown moves between two queries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trainroom.core.job.slurm import SlurmJob, SlurmJobError, read_slurm_job, slurm_view
from trainroom.core.job.view import NodeReading
from trainroom.core.slurm.scontrol import SlurmReader

REFRESH_S = 3.0

Read = Callable[[str, SlurmReader], SlurmJob]


def _read(job_id: str, reader: SlurmReader) -> SlurmJob:
    return read_slurm_job(job_id, reader)


class SlurmWatch:
    """The last reading of one Slurm job; `start()` keeps it fresh on a thread."""

    def __init__(
        self,
        job_id: str,
        reader: SlurmReader | None = None,
        *,
        interval_s: float = REFRESH_S,
        read: Read = _read,
    ) -> None:
        self.job_id = job_id
        self.reader = reader or SlurmReader()
        self.interval_s = max(interval_s, self.reader.min_interval_s)
        self._read = read
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.job: SlurmJob | None = None
        self.error: str | None = None  # the last refresh's failure (the last good job is kept)
        self.refreshes = 0

    def refresh(self) -> SlurmJob:
        """Read the job once now; raises SlurmJobError when it cannot be shown at all."""
        job = self._read(self.job_id, self.reader)
        with self._lock:
            self.job, self.error = job, None
            self.refreshes += 1
        return job

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"slurm-{self.job_id}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception as exc:  # whatever failed, the screen keeps its last answer
                # A refresh that fails keeps the last answer on screen, and says why.
                with self._lock:
                    self.error = str(exc) if isinstance(exc, SlurmJobError | OSError) else repr(exc)

    @property
    def name(self) -> str:
        with self._lock:
            return self.job.name if self.job is not None else f"slurm-{self.job_id}"

    def readings(self) -> list[NodeReading]:
        with self._lock:
            return list(self.job.readings) if self.job is not None else []

    def view(self, now: float | None = None) -> dict[str, Any] | None:
        """Slurm's side of the job (`slurm_view`, as `--json` prints it under "slurm")."""
        with self._lock:
            job, error = self.job, self.error
        if job is None:
            return None
        v = slurm_view(job, time.time() if now is None else now)
        if error is not None:
            v["refresh_error"] = error
        return v
