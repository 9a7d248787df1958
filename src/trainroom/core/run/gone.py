"""A run whose keeper is gone while its journal says the attempt runs: its trainer still running
(orphaned) or ended unseen. Decided once, here: `trainroom status`, `trainroom kill` and the control
room's header all read it, so they say the same state word, the same way on and the same age."""

from __future__ import annotations

from dataclasses import dataclass

from trainroom.core.probes.adopt import still_runs
from trainroom.core.run import store as runs
from trainroom.core.run.state import RunState
from trainroom.core.units import fmt_duration
from trainroom.core.vocab import Unwatched


def orphaned_trainer(st: RunState) -> int | None:
    """The pid of a trainer that outlived its keeper: the journal's attempt has no end, and its
    process (by pid and start tick) still runs (a zombie, killed -9 and not reaped yet, has ended)."""
    a = st.attempt
    if a is None or a.ended_at is not None or a.pid <= 0:
        return None
    return a.pid if still_runs(a.pid, a.start_time, a.start_ticks) else None


@dataclass(frozen=True)
class KeeperGone:
    """What is known of a run whose keeper is gone (the process check done once, by whoever
    reads it) and its words as of a time: the age in them is the reader's clock's, so a view
    that redraws says a true age."""

    state: Unwatched
    run_id: str
    pid: int  # the attempt's trainer: the orphan, or the process that ended unseen
    attached: bool
    next_attempt: int
    verified_step: int | None
    since: float | None  # the journal's last write: the latest the keeper is known to have lived

    def age_s(self, now: float) -> float | None:
        return max(0.0, now - self.since) if self.since is not None else None

    def reason(self, now: float) -> str:
        """The way on, in words: the actions that act, and how long ago the keeper last wrote."""
        age_s = self.age_s(now)
        age = (
            f"its journal's last write {fmt_duration(age_s)} ago"
            if age_s is not None
            else "its journal's last write unknown"
        )
        pid, run_id = self.pid, self.run_id
        if self.state == "orphaned" and self.attached:
            return (
                f"keeper detached ({age}); the attached trainer pid {pid} runs on untouched: "
                f"`trainroom attach {pid}` watches it again, `trainroom kill {run_id}` ends it"
            )
        if self.state == "orphaned":
            return (
                f"keeper gone ({age}); trainer pid {pid} still running (orphaned): `trainroom kill {run_id}` "
                f"ends it (then `trainroom resume {run_id}`), or `trainroom attach {pid}` takes it back "
                "under a new keeper"
            )
        frm = (
            f"the last verified checkpoint (step {self.verified_step})"
            if self.verified_step is not None
            else "scratch (nothing verified)"
        )
        return (
            f"keeper gone ({age}) and trainer pid {pid} no longer runs; its end was not recorded: "
            f"`trainroom resume {run_id}` starts attempt {self.next_attempt} under a new keeper from {frm}"
        )


def keeper_gone(st: RunState, info: runs.RunInfo) -> KeeperGone | None:
    """The state and the way on for a run whose keeper is gone while its journal says the attempt
    runs: its trainer still running (orphaned) or ended unseen, with the journal's last write (a
    keeper killed -9 says nothing more). None: the journal's own state stands, and for a run on
    another host (whether its trainer runs is that host's to say, not this one's /proc)."""
    a = st.attempt
    if a is None or a.ended_at is not None or info.remote:
        return None
    orphan = orphaned_trainer(st)
    verified = st.last_verified()
    return KeeperGone(
        state="orphaned" if orphan is not None else "unknown",
        run_id=st.run_id,
        pid=a.pid,
        attached=a.attached,
        next_attempt=a.n + 1,
        verified_step=verified.step if verified is not None else None,
        since=runs.last_write(info),
    )
