"""Every action, once, in key order: the keeper serves these, the CLI makes its verbs of them,
the control room its keys, palette and "why not now", and the docs their table.

Adding an action: a module beside this one with its `Action` subclass, and one line below."""

from __future__ import annotations

from typing import Any

from trainroom.core.actions.base import Action, ActionSpec
from trainroom.core.actions.bench import Bench
from trainroom.core.actions.dump import Dump
from trainroom.core.actions.kill import Kill
from trainroom.core.actions.prune import Prune
from trainroom.core.actions.reclaim import Reclaim
from trainroom.core.actions.resume import Resume
from trainroom.core.actions.verify import Verify
from trainroom.core.actions.wake import Continue

REGISTRY: dict[str, Action[Any, Any, Any]] = {
    a.spec.name: a for a in (Kill(), Reclaim(), Prune(), Resume(), Dump(), Continue(), Verify(), Bench())
}
SPECS: tuple[ActionSpec, ...] = tuple(a.spec for a in REGISTRY.values())
NAMES: tuple[str, ...] = tuple(REGISTRY)
CANCELLABLE: tuple[str, ...] = tuple(s.name for s in SPECS if s.cancellable)
DESTRUCTIVE: frozenset[str] = frozenset(s.name for s in SPECS if s.destructive)
KEYS: dict[str, str] = {s.name: s.key for s in SPECS}


def action(name: str) -> Action[Any, Any, Any]:
    return REGISTRY[name]


def markdown_table() -> str:
    """The registry as the docs' markdown table: docs/actions.md holds exactly this between its
    `<!-- actions:begin -->` and `<!-- actions:end -->` markers (a unit test compares them)."""
    rows = [
        "| action | key | what it does | asks first | acts when |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| `{s.name}` | `{s.key}` | {s.description} | {'yes' if s.destructive else 'no'} | {s.when} |"
        for s in SPECS
    ]
    return "\n".join(rows) + "\n"
