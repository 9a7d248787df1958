"""How an attempt ended, in the words every surface shows (`run.ended`)."""

from __future__ import annotations

import signal

from trainroom.core.run.ended import NOT_YET_KNOWN, attempt_ended, how_ended
from trainroom.core.run.events import Event, to_text
from trainroom.core.run.parts import AttemptView


def test_each_way_to_end_in_words() -> None:
    assert how_ended(None, int(signal.SIGKILL)) == "killed by SIGKILL"
    assert how_ended(None, "SIGTERM") == "killed by SIGTERM"
    assert how_ended(0, None) == "exited 0"
    assert how_ended(1, None) == "exit code 1"
    assert how_ended(137, None) == "exit code 137 (128+SIGKILL, through a shell)"
    assert how_ended(127, None, error="could not start: no such file") == "could not start: no such file"
    assert how_ended(None, None) == NOT_YET_KNOWN
    assert how_ended(None, None, unknown="ended (how is not known)") == "ended (how is not known)"


def test_a_users_kill_is_said_as_a_stop() -> None:
    a = AttemptView(
        n=1,
        pid=10,
        pgid=10,
        start_time=0.0,
        started_at=0.0,
        argv=["t"],
        cwd="/",
        ended_at=5.0,
        exit_signal=15,
    )
    assert attempt_ended(a) == "killed by SIGTERM"
    a.stop_by, a.stop_until = "the user", 9.0
    assert attempt_ended(a) == "stopped by the user (killed by SIGTERM)"


def test_the_event_line_says_it_the_same_way() -> None:
    e = Event(t=1.0, run="r", event="attempt-ended", attempt=2, exit_signal="SIGKILL")
    assert to_text(e).endswith("attempt 2 killed by SIGKILL")
    e = Event(t=1.0, run="r", event="attempt-ended", attempt=2, exit_code=3)
    assert to_text(e).endswith("attempt 2 exit code 3")
