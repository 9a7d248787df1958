"""The fold of findings raised and cleared, and of what came of them: the actions taken, the
alerts delivered, the batches logged around a spike or a non-finite value."""

from __future__ import annotations

from typing import Protocol

from trainroom.core.findings import Finding
from trainroom.core.run.parts import ResolvedFinding
from trainroom.core.wire import protocol as p

ACTIONS = 50
NOTIFICATIONS = 50
RESOLVED = 50  # cleared findings kept, newest last: the control room's history
BATCH_LOGS = 16


class Run(Protocol):
    """What the finding handlers read and write of the run's state."""

    findings: dict[str, Finding]
    resolved: list[ResolvedFinding]
    actions: list[p.ActionRecord]
    notifications: list[p.NotifyResult]
    notify_outcomes: dict[str, int]
    batch_logs: list[p.BatchLog]


def _finding(st: Run, r: p.FindingRaised) -> None:
    st.findings[r.finding.ident] = r.finding


def _finding_cleared(st: Run, r: p.FindingCleared) -> None:
    f = st.findings.pop(r.ident, None)
    if f is not None:
        st.resolved.append(ResolvedFinding(finding=f, cleared_at=r.t))
        del st.resolved[:-RESOLVED]


def _action(st: Run, r: p.ActionRecord) -> None:
    st.actions.append(r)
    del st.actions[:-ACTIONS]


def _notify(st: Run, r: p.NotifyResult) -> None:
    st.notifications.append(r)
    del st.notifications[:-NOTIFICATIONS]
    st.notify_outcomes[r.outcome] = st.notify_outcomes.get(r.outcome, 0) + 1


def _batch_log(st: Run, r: p.BatchLog) -> None:
    st.batch_logs.append(r)
    del st.batch_logs[:-BATCH_LOGS]
