"""Every key of the control room: one `Binding` each, with an id (remappable through
`App.set_keymap`) and a tooltip (the help screen and the command palette show it).

The keeper's actions come from core's one table (`trainroom.core.findings.ACTIONS`), so a key, a
description or whether an action asks first is written once, for every client.
"""

from __future__ import annotations

from textual.binding import Binding

from trainroom.core.findings import ACTIONS

# Actions the keeper carries out, by name (the protocol's `Request.action`), in key order.
KEEPER_ACTIONS: tuple[str, ...] = tuple(a.name for a in ACTIONS)
# These change the world: the plan is shown in a confirmation first.
DESTRUCTIVE: frozenset[str] = frozenset(a.name for a in ACTIONS if a.destructive)

KEEPER_BINDINGS: list[Binding] = [
    Binding(a.key, a.name, a.name, id=f"trainroom.{a.name}", tooltip=a.description) for a in ACTIONS
]

BINDINGS: list[Binding] = [
    *KEEPER_BINDINGS,
    # Off the footer (80 columns hold the rest); still in the help screen and the palette.
    Binding("t", "next_theme", "theme", show=False, id="trainroom.theme", tooltip="Switch to the next theme"),
    Binding(
        "question_mark",
        "help",
        "help",
        key_display="?",
        id="trainroom.help",
        tooltip="Show every key, what it does and whether it applies now",
    ),
    Binding(
        "q",
        "quit",
        "quit",
        id="trainroom.quit",
        tooltip="Close the control room (the run and its keeper go on)",
    ),
]
