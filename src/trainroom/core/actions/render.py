"""Every plan in words, in one place, for every client: the CLI prints `plan_lines` under the
keeper's summary, the control room's confirmation (and its result's "acted on") shows
`confirmation`. A plan is decoded once, here, into its action's typed `Target` and said by the
action's own words; a plan no action here can read (an action this code does not know, an older
keeper's shape) is said field by field (`words.plan_fields`), never a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainroom.core.actions import words
from trainroom.core.actions.base import Action
from trainroom.core.actions.registry import REGISTRY


def _typed(action: str, plan: Mapping[str, object]) -> tuple[Action[Any, Any, Any], Any] | None:
    act = REGISTRY.get(action)
    shown = act.decode(plan) if act is not None else None
    return None if act is None or shown is None else (act, shown)


def plan_lines(action: str, plan: Mapping[str, object]) -> list[str]:
    """The plan as the CLI prints it under the keeper's one-line summary (indented by two)."""
    typed = _typed(action, plan)
    if typed is None:
        return ["  " + line for line in words.plan_fields(plan)]
    act, shown = typed
    return act.plan_lines(shown)


def headline(action: str, plan: Mapping[str, object], summary: str) -> str:
    """The one line a confirmation opens with (the keeper's summary when the action has none)."""
    typed = _typed(action, plan)
    return summary if typed is None else typed[0].headline(typed[1], summary) or summary


def confirmation(action: str, plan: Mapping[str, object], summary: str) -> tuple[str, list[str]]:
    """(headline, detail lines) of a plan, as the action words them, the details one step in
    from the headline."""
    typed = _typed(action, plan)
    if typed is None:
        return summary, words.plan_fields(plan)
    act, shown = typed
    lines = act.detail_lines(shown)
    return act.headline(shown, summary) or summary, [
        line[2:] if line.startswith("  ") else line for line in lines
    ]
