"""Which of the actions the open findings name would act now: `status --json`, `status` and the
control room offer an action only then (a DEAD run with no verified checkpoint names no resume,
EXPLODED_START no verify while nothing has verified), and say why not in its place."""

from __future__ import annotations

from typing import Any

from trainroom.core.actions.registry import REGISTRY
from trainroom.core.findings import Finding
from trainroom.core.run.state import RunState

KEEPER_GONE = "the keeper is gone: resume works without it, or use `trainroom kill RUN` in a shell"


def refused(state: RunState, f: Finding, keeper_alive: bool = True) -> str | None:
    """Why the action finding `f` names would not act now, in the keeper's words; None when it
    would (or the finding names none)."""
    act = REGISTRY.get(f.action) if f.action else None
    if act is None:
        return None
    if not keeper_alive and act.spec.needs_keeper:
        return KEEPER_GONE
    targeted = f.target is not None and bool(f.target.pids)
    return act.refusal(state, {"finding": f.ident} if targeted else {}, offer=True)


def offered_only(state: RunState, d: dict[str, Any], keeper_alive: bool = True) -> dict[str, Any]:
    """`d` (a `status_dict`) with each finding's and row's `action` kept only where it acts now;
    elsewhere `action` is null and `action_refused` says why."""
    open_ = {f.ident: f for f in state.open_findings()}
    for item in (*d.get("findings", ()), *d.get("finding_rows", ())):
        ident = item.get("ident") or item.get("latest")
        f = open_.get(ident) if isinstance(ident, str) else None
        if f is None or not item.get("action"):
            continue
        why = refused(state, f, keeper_alive)
        if why is not None:
            item["action"], item["action_refused"] = None, why
    return d
