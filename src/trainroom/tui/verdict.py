"""What is wrong, and what can be done about it: the header's verdict, the findings list with
each finding's fix key and target, the resolved history, and why an action cannot act now.
Pure, no Textual: the app and the tests share it.

Whether an action can act is the action's own precondition, the one the keeper applies
(`trainroom.core.actions`); `refusal` adds only what the control room knows (a keeper that is
gone, an action under way). A key that cannot act says why (a notify line), a finding offers
only a key that can act, and the key strip, the palette and the help screen show the same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from trainroom.core.actions.offered import KEEPER_GONE
from trainroom.core.actions.registry import REGISTRY
from trainroom.core.findings import SEVERITY_RANK, Finding
from trainroom.core.probes.adopt import still_runs
from trainroom.core.run.causes import Kind, Row, fold
from trainroom.core.run.figures import stall_bound, step_age
from trainroom.core.run.gone import KeeperGone
from trainroom.core.run.nowwords import now_findings
from trainroom.core.run.state import RunState
from trainroom.core.vocab import ActionName, FindingCode, Level, Severity, ShownState

from . import fmt

SEVERITY_LEVEL: dict[str, Level] = {"critical": "crit", "warning": "warn", "info": "info"}
SEVERITY_WORD: dict[str, str] = {"critical": "CRIT", "warning": "WARN", "info": "INFO"}
# How bad each state is on its own; the header takes the worse of this and the worst finding.
STATE_LEVEL: dict[ShownState, Level] = {
    "starting": "info",
    "running": "ok",
    "slow": "warn",
    "stalled": "crit",
    "hung": "crit",
    "dead": "crit",
    "failed": "crit",
    "orphaned": "crit",  # the trainer lives, its keeper does not: nobody watches it
    "unknown": "warn",  # the keeper died before its trainer: nobody saw the end
    "exited": "dim",
    "stopped": "dim",  # the user killed it: nothing is wrong
}
_RANK: dict[Level, int] = {"dim": -1, "ok": 0, "info": 1, "warn": 2, "crit": 3}


def level_of_state(state: ShownState) -> Level:
    return STATE_LEVEL.get(state, "info")


def worse(a: Level, b: Level) -> Level:
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


# --------------------------------------------------------------------------- can it act?


@dataclass(frozen=True)
class Situation:
    """What decides whether an action can act, besides the run's state."""

    connected: bool  # the keeper answers
    busy: str | None = None  # the action under way, if any
    has_run: bool = True


def refusal(state: RunState | None, action: str, where: Situation, finding: str | None = None) -> str | None:
    """Why `action` cannot act now, in words; None when it can. `finding`: on that finding's own
    target (a kill of pid 4974) rather than the run's trainer."""
    if where.busy is not None:
        return f"{where.busy} is under way: one action at a time"
    if state is None or not where.has_run:
        return "no run is open yet"
    act = REGISTRY[action]
    if not where.connected and act.spec.needs_keeper:
        return KEEPER_GONE
    if not where.connected:
        a = state.attempt
        if a is not None and a.ended_at is None and a.pid > 0:
            if still_runs(a.pid, a.start_time, a.start_ticks):
                return (
                    f"trainer pid {a.pid} still runs without its keeper: `trainroom attach {a.pid}` takes it "
                    f"back under a new keeper, or `trainroom kill {state.run_id}` in a shell ends it (then R)"
                )
            # Its end was never recorded: a new keeper takes the run up and closes it first.
            a = msgspec.structs.replace(a, ended_at=a.last_step_t or a.started_at)
            state = msgspec.structs.replace(state, attempts=[*state.attempts[:-1], a])
    return act.refusal(state, {"finding": finding} if finding is not None else {}, offer=True)


# --------------------------------------------------------------------------- the header


def live_reason(state: RunState, now: float) -> str:
    """The state's reason with the last step's age as of `now`. The keeper words a stall once, by
    its bound ("no step within 10 s"); while the trainer stays stalled or hung the header says how
    long it has been, so the figure on screen ages with the clock."""
    reason = state.status_reason
    a = state.attempt
    if state.status not in ("stalled", "hung") or a is None or not a.alive:
        return reason
    age = step_age(state, now)
    if age is None:
        return reason
    bound, _ = stall_bound(state)
    live = f"no step for {fmt.duration(age)} (bound {fmt.duration(bound)})"
    cut = reason.find("no step within")
    if cut >= 0:
        return reason[:cut] + live
    return f"{reason}; {live}" if reason else live


@dataclass(frozen=True)
class HeaderView:
    run_id: str
    attempt: int | None
    attempts: int
    state: ShownState
    reason: str
    state_age_s: float | None  # for how long the verdict has held (whole seconds: a view that
    step: int | None  # does not change does not re-render)
    connected: bool
    keeper_busy: bool  # not connected, but its process lives: busy, not gone
    level: Level  # the worse of the state's and the worst open finding's: the badge's colour
    worst_code: str | None  # the worst open root cause at warning or above, named beside the badge
    worst_level: Level
    more: int  # how many more rows of findings are open besides its own
    # Where the worst cause is, when it is one device's (a GPU fault): "GPU 0 (0000:3b:00.0)".
    worst_where: str = ""
    attached: bool = False  # the attempt is a process `trainroom attach` adopted
    worst_age_s: float | None = None  # how long the named root cause has been open


def header_view(
    state: RunState, now: float, connected: bool, keeper_busy: bool = False, gone: KeeperGone | None = None
) -> HeaderView:
    """`gone`: the keeper is gone while the journal says the attempt runs (`run.gone`, as `status`
    decides it): its state word (ORPHANED, UNKNOWN), its way on and its age (since the journal's
    last write) replace the journal's last state, which nobody watches any more."""
    a = state.attempt
    step = state.current_step()
    if step is None and a is not None:
        step = a.last_step
    # The root causes (`run.causes.fold`): a consequence is never named while its cause is open.
    found_now = now_findings(state.open_findings(), now if connected else None)
    rows = [r for r in fold(found_now) if SEVERITY_RANK.get(r.severity, 0) >= 1]
    found = [r.head for r in rows]
    # A finding that is the state itself (DEAD for `dead`) is said by the badge already.
    named = [f for f in found if f.code.lower() != state.status]
    worst = named[0] if named else None
    worst_level = (
        SEVERITY_LEVEL.get(next(r.severity for r in rows if r.head is worst), "info") if worst else "ok"
    )
    shown: ShownState = state.status
    reason = live_reason(state, now)
    age = float(round(now - state.status_since)) if state.status_since else None
    if gone is not None and not connected and not keeper_busy:
        shown, reason, since = gone.state, gone.reason(now), gone.age_s(now)
        age = float(round(since)) if since is not None else None
    level = level_of_state(shown)
    for r in rows[:1]:
        level = worse(level, SEVERITY_LEVEL.get(r.severity, "info"))
    return HeaderView(
        run_id=state.run_id,
        attempt=a.n if a else None,
        attempts=len(state.attempts),
        state=shown,
        reason=reason,
        state_age_s=age,
        step=step,
        connected=connected,
        keeper_busy=keeper_busy and not connected,
        level=level if connected else worse(level, "warn"),
        worst_code=worst.code if worst else None,
        worst_level=worst_level,
        more=len(named) - 1 if named else 0,
        worst_where=_device_of(worst),
        attached=a.attached if a else False,
        worst_age_s=float(round(now - worst.first_seen)) if worst is not None and worst.first_seen else None,
    )


def _device_of(f: Finding | None) -> str:
    ev = f.evidence if f is not None else {}
    dev = ev.get("device")
    if f is None or not f.code.startswith("GPU_") or not isinstance(dev, int) or isinstance(dev, bool):
        return ""
    bus = ev.get("bus_id")
    return f"GPU {dev}" + (f" ({bus})" if isinstance(bus, str) and bus else "")


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class FollowRow:
    """What follows from a row's cause, one code a line (`run.causes.Row.consequences`)."""

    code: FindingCode
    severity: Severity
    level: Level
    count: int
    since: str  # "14 checkpoints rejected since NONFINITE at step 31"
    messages: tuple[str, ...]  # each finding's own words, the newest first
    idents: tuple[str, ...]


@dataclass(frozen=True)
class FindingRow:
    """One row of the findings: a root cause, the newest of its code (the one its key acts on),
    with its repeats counted and what follows from it under it."""

    ident: str
    code: FindingCode
    severity: Severity
    level: Level
    message: str
    action: ActionName | None
    fix: str | None  # what the key does, target first: "kill pid 4974, the second trainer"
    key: str | None  # the key that does it now; None when it cannot act
    why_not: str | None  # why the action cannot act now (the detail view says it)
    targeted: bool  # the action acts on this finding's target, not the run's trainer
    first_seen: float
    last_seen: float
    evidence: tuple[tuple[str, Any], ...]
    count: int = 1  # findings of its code it stands for
    repeats: tuple[str, ...] = ()  # the words of the others of its code, the newest first
    repeat_idents: tuple[str, ...] = ()
    follow: tuple[FollowRow, ...] = ()

    @property
    def idents(self) -> tuple[str, ...]:
        """Every finding the row stands for: a cursor on one of them is on this row."""
        return (self.ident, *self.repeat_idents, *(i for k in self.follow for i in k.idents))


def fix_text(f: Finding) -> str | None:
    if f.action is None:
        return None
    if f.target is not None and f.target.label:
        return f"{f.action} {f.target.label}"
    return f.action


def findings_view(
    state: RunState,
    key_of: Callable[[str], str],
    where: Situation,
    now: float | None = None,
) -> tuple[FindingRow, ...]:
    """The rows every client shows (`run.causes.fold`): a root cause with what follows from it,
    most severe first, then newest; each with the key of its action only when that can act now,
    and its words with the figures of `now` while the keeper watches (`run.nowwords`)."""
    rows = []
    for row in fold(now_findings(state.open_findings(), now if where.connected else None)):
        f = row.head
        targeted = f.target is not None and bool(f.target.pids)
        why = refusal(state, f.action, where, f.ident if targeted else None) if f.action else None
        rows.append(
            FindingRow(
                ident=f.ident,
                code=f.code,
                # The row is as severe as the worst it holds, as `status` says it.
                severity=row.severity,
                level=SEVERITY_LEVEL.get(row.severity, "info"),
                message=row.cause.said(),  # one finding's words, or how many and the newest
                action=f.action,
                fix=fix_text(f),
                key=key_of(f.action) if f.action and why is None else None,
                why_not=why,
                targeted=targeted,
                first_seen=f.first_seen,
                last_seen=f.last_seen,
                evidence=tuple(f.evidence.items()),
                count=row.cause.count,
                repeats=tuple(x.message for x in row.cause.findings[1:]),
                repeat_idents=tuple(x.ident for x in row.cause.findings[1:]),
                follow=tuple(_follow(row, k) for k in row.consequences),
            )
        )
    return tuple(rows)


def _follow(row: Row, k: Kind) -> FollowRow:
    return FollowRow(
        code=k.code,
        severity=k.severity,
        level=SEVERITY_LEVEL.get(k.severity, "info"),
        count=k.count,
        since=row.since(k),
        messages=tuple(x.message for x in k.findings),
        idents=tuple(x.ident for x in k.findings),
    )


@dataclass(frozen=True)
class ResolvedRow:
    code: FindingCode
    severity: Severity
    message: str
    first_seen: float
    cleared_at: float
    evidence: tuple[tuple[str, Any], ...]


def resolved_view(state: RunState) -> tuple[ResolvedRow, ...]:
    """Cleared findings, newest first."""
    return tuple(
        ResolvedRow(
            code=r.finding.code,
            severity=r.finding.severity,
            message=r.finding.message,
            first_seen=r.finding.first_seen,
            cleared_at=r.cleared_at,
            evidence=tuple(r.finding.evidence.items()),
        )
        for r in reversed(state.resolved)
    )


@dataclass(frozen=True)
class FindingsView:
    open: tuple[FindingRow, ...]
    resolved: tuple[ResolvedRow, ...]


def farewell(run_id: str, state: RunState | None, connected: bool) -> str:
    """What quitting says: the run goes on without the control room, and how to come back to it
    or stop it (or, for a run that is over, how to look again or resume it). One command a line,
    so a narrow terminal never wraps one mid-word."""
    a = state.attempt if state is not None else None
    if state is not None and a is not None and a.alive:
        return (
            f"trainroom: run {run_id} goes on (attempt {a.n}, {state.status}, pid {a.pid})\n"
            f"  reattach: trainroom watch {run_id}\n"
            f"  stop it:  trainroom kill {run_id}"
        )
    status = state.status if state is not None else "unknown"
    keeper = "its keeper is still up" if connected else "its keeper is gone"
    # A resume is named only when it would be offered (a checkpoint verified); else a new start.
    no_resume = REGISTRY["resume"].refusal(state, {}, offer=True) if state is not None else None
    again = (
        f"  resume it:  trainroom resume {run_id}"
        if no_resume is None
        else "  start again: trainroom launch -- COMMAND (no verified checkpoint to resume from)"
    )
    return f"trainroom: run {run_id} is {status} ({keeper})\n  look again: trainroom watch {run_id}\n{again}"


def kill_keys(rows: tuple[FindingRow, ...], target: FindingRow | None) -> tuple[FindingRow, ...]:
    """A targeted kill shows the kill key only on the finding the key acts on now (`target`);
    another says how to reach it (Enter on it)."""
    out = []
    for r in rows:
        if r.targeted and r.action == "kill" and r.key and (target is None or r.ident != target.ident):
            r = replace(r, key=None, why_not="select it in the findings (tab, j/k), or Enter: its detail")
        out.append(r)
    return tuple(out)
