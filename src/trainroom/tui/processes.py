"""The processes key (`p`): the processes screen over the control room, fed from the run's state
under the reader's lock, its signal handed to the action flow (the keeper plans, the person
confirms, as for every kill). A mixin, so the app stays the size it is."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from textual.app import App

from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

if TYPE_CHECKING:  # the table and its screen load when first opened, not before the first frame
    from .proctable import ProcLine, ProcsView


class StartsActions(Protocol):
    def start_args(self, action: str, args: dict[str, object], question: str | None = None) -> None: ...


class ProcessesKey:
    """Mixed into the control room (an `App`): `p` opens the processes screen."""

    lock: threading.Lock
    state: RunState | None
    run_info: RunInfo | None

    def action_processes(self) -> None:
        assert isinstance(self, App)
        run = self.run_info.run_id if self.run_info is not None else "no run"
        from .screens.processes import ProcessesScreen

        self.push_screen(ProcessesScreen(self.procs_now, self.signal_process, f"runs › {run}"))

    def procs_now(self, sort: str, reverse: bool) -> ProcsView:
        from .proctable import procs_view

        with self.lock:
            return procs_view(self.state, sort, reverse)

    def signal_process(self, line: ProcLine, signal: str) -> None:
        args: dict[str, object] = {"pid": line.pid, "start_ticks": line.start_ticks, "signal": signal}
        flow: StartsActions = self.flow  # type: ignore[attr-defined]  # the app's ActionFlow
        flow.start_args("kill", args, f"Send SIG{signal} to {line.label}?")
