"""Every action, once, in key order: the keeper serves these, the CLI makes its verbs of them,
the control room its keys, palette and "why not now", and the docs their table.

Adding an action: a module beside this one with its `Action` subclass (its spec, its typed
`Args` with each argument's help and CLI flag, its typed plan and the plan's words), and one line
in `ACTIONS` below: the keeper serves it, the CLI makes its verb and options, the control room
its key (asking for a required argument it does not have), the docs their table row."""

from __future__ import annotations

from typing import Any

from trainroom.core.actions import options
from trainroom.core.actions.base import Action, ActionSpec
from trainroom.core.actions.bench import Bench
from trainroom.core.actions.dump import Dump
from trainroom.core.actions.kill import Kill
from trainroom.core.actions.prune import Prune
from trainroom.core.actions.reclaim import Reclaim
from trainroom.core.actions.resume import Resume
from trainroom.core.actions.verify import Verify
from trainroom.core.actions.wake import Continue
from trainroom.core.vocab import ActionName

# The registry line: one entry per action, in key order.
ACTIONS: tuple[Action[Any, Any, Any], ...] = (
    Kill(),
    Reclaim(),
    Prune(),
    Resume(),
    Dump(),
    Continue(),
    Verify(),
    Bench(),
)

REGISTRY: dict[str, Action[Any, Any, Any]] = {}
SPECS: tuple[ActionSpec, ...] = ()
NAMES: tuple[str, ...] = ()
CANCELLABLE: tuple[ActionName, ...] = ()
DESTRUCTIVE: frozenset[ActionName] = frozenset()
KEYS: dict[ActionName, str] = {}


def register(*actions: Action[Any, Any, Any]) -> None:
    """Serve `actions` too, after those above (an action of a plugin's, or of a test's own): called
    before a client imports what is derived here (the control room binds its keys at import)."""
    global SPECS, NAMES, CANCELLABLE, DESTRUCTIVE, KEYS
    for a in actions:
        if a.spec.name in REGISTRY or a.spec.key in {s.key for s in SPECS}:
            raise ValueError(f"action {a.spec.name!r} (key {a.spec.key}) is already served")
        REGISTRY[a.spec.name] = a
        SPECS = tuple(x.spec for x in REGISTRY.values())
    NAMES = tuple(REGISTRY)
    CANCELLABLE = tuple(s.name for s in SPECS if s.cancellable)
    DESTRUCTIVE = frozenset(s.name for s in SPECS if s.destructive)
    KEYS = {s.name: s.key for s in SPECS}


register(*ACTIONS)


def action(name: ActionName) -> Action[Any, Any, Any]:
    return REGISTRY[name]


def arguments_cell(a: Action[Any, Any, Any]) -> str:
    """An action's CLI options as the docs' table lists them (made of its `Args`)."""
    if not a.spec.cli_verb:
        return f"`trainroom {a.spec.name} --help`"
    shown = []
    for o in options.options(a.Args):
        if not o.arg.cli:
            continue
        switch = o.base is bool and o.arg.parse is None
        value = "" if switch else " " + (o.arg.metavar or o.flag.removeprefix("--").upper().replace("-", "_"))
        shown.append(f"`{o.flag}{value}`" + (" (required)" if o.arg.required else ""))
    return ", ".join(shown) or "none"


def markdown_table() -> str:
    """The registry as the docs' markdown table: docs/actions.md holds exactly this between its
    `<!-- actions:begin -->` and `<!-- actions:end -->` markers (a unit test compares them;
    `python scripts/actions_table.py` writes it)."""
    rows = [
        "| action | key | what it does | asks first | acts when | options |",
        "|---|---|---|---|---|---|",
    ]
    rows += [
        f"| `{s.name}` | `{s.key}` | {s.description} | {'yes' if s.destructive else 'no'} | {s.when} "
        f"| {arguments_cell(REGISTRY[s.name])} |"
        for s in SPECS
    ]
    return "\n".join(rows) + "\n"
