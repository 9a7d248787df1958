"""How an attempt (or one rank's process) ended, in words, once: every place that says it (the
run's status and its text, the DEAD finding, the event lines, alerts, the job view, the control
room) reads these, so a death reads the same wherever it is shown.

"killed by SIGKILL", "exit code 1", "exit code 137 (128+SIGKILL, through a shell)" (a shell
passes a child's death by signal on as 128+N), "exited 0", the keeper's own error when the
trainer could not start, and "process gone, exit status not yet known" before waitpid has told.
"""

from __future__ import annotations

from trainroom.core.run.parts import AttemptView
from trainroom.core.run.state import RunState
from trainroom.core.units import signal_name

NOT_YET_KNOWN = "process gone, exit status not yet known"


def how_ended(
    exit_code: int | None,
    exit_signal: int | str | None,
    error: str | None = None,
    unknown: str = NOT_YET_KNOWN,
) -> str:
    """The end of one process in words (`exit_signal`: its number, or its name already said)."""
    if error:
        return error
    if exit_signal is not None:
        return f"killed by {exit_signal if isinstance(exit_signal, str) else signal_name(exit_signal)}"
    if exit_code is None:
        return unknown
    if exit_code == 0:
        return "exited 0"
    if exit_code > 128 and 1 <= exit_code - 128 < 65:
        return f"exit code {exit_code} (128+{signal_name(exit_code - 128)}, through a shell)"
    return f"exit code {exit_code}"


def returncode_ended(code: int) -> str:
    """A child's return code in the same words (`subprocess`'s: negative when a signal killed it)."""
    return how_ended(None, -code) if code < 0 else how_ended(code, None)


def attempt_ended(a: AttemptView) -> str:
    """How attempt `a` ended; a user's kill says so first ("stopped by the user (killed by
    SIGTERM)")."""
    how = how_ended(a.exit_code, a.exit_signal, a.error)
    return f"stopped by {a.stop_by} ({how})" if a.stopped else how


def clean_exit(a: AttemptView) -> bool:
    """Ended on its own with status 0: "exited", not a death."""
    return a.ended_at is not None and a.exit_code == 0 and a.exit_signal is None and a.error is None


def live_attempt(state: RunState) -> bool:
    """The run's attempt has not ended: its trainer lives (what an action on the trainer needs)."""
    a = state.attempt
    return a is not None and a.alive


def not_running(state: RunState) -> str:
    """Why an action on the trainer cannot act: no attempt, or how the last one ended, in the
    words every reader uses ("the trainer is not running (attempt 1 ended: killed by SIGKILL)")."""
    a = state.attempt
    if a is None:
        return "the trainer is not running (no attempt has started)"
    return f"the trainer is not running (attempt {a.n} ended: {attempt_ended(a)})"
