"""Every key of the control room: one `Binding` each, with an id (remappable from `trainroom.toml`
`[keys]` through `App.set_keymap`) and a tooltip (the help screen and the command palette show it).

The keeper's actions come from core's action registry (`trainroom.core.actions.registry`), so a
default key, a description or whether an action asks first is written once, for every client. What
changes the world takes a capital or a ctrl chord (k9s kills with ctrl+k): a vim, k9s or lazygit
user moves with j/k/g/G, searches with / and never hits one by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.binding import Binding
from textual.keys import _character_to_key, format_key

from trainroom.core.actions.registry import DESTRUCTIVE as DESTRUCTIVE  # asks first (the help says)
from trainroom.core.actions.registry import NAMES, SPECS
from trainroom.core.configuration.sections import Keys

# Actions the keeper carries out, by name (the protocol's `Request.action`), in key order.
KEEPER_ACTIONS: tuple[str, ...] = NAMES
ID_PREFIX = "trainroom."


@dataclass(frozen=True)
class Command:
    """A control-room command: its `[keys]` name, the app action it runs, its default key."""

    name: str
    action: str
    key: str
    label: str  # a word or two for the key strip
    tooltip: str


# The keeper's actions first, then the control room's own commands.
COMMANDS: tuple[Command, ...] = (
    *(Command(a.name, a.name, a.key, a.name, a.description) for a in SPECS),
    Command(
        "cancel",
        "cancel_action",
        "X",
        "cancel",
        "Cancel the action running now where it can be (a kill's wait for the GPU memory, a bench)",
    ),
    Command("runs", "runs", "o", "runs", "The runs overview: every run, sortable; Enter opens one"),
    Command(
        "processes",
        "processes",
        "p",
        "processes",
        "Every process of the run as a tree: CPU, memory, GPU, state, command; signal one (asks first)",
    ),
    Command(
        "history",
        "history",
        "H",
        "history",
        "History graphs over the run: RAM, page cache, VRAM, GPU, CPU, disk (w: 5 min / 1 h / all)",
    ),
    Command("options", "options", "O", "options", "Options: refresh rate, units, graph style (kept)"),
    Command(
        "command",
        "command_line",
        "colon",
        ":",
        "The command line: a command by name, with arguments (:prune keep 3, :theme light); tab completes",
    ),
    Command(
        "next_panel",
        "next_panel",
        "tab",
        "panels",
        "Focus the next panel; one the layout has no room for opens zoomed",
    ),
    Command("previous_panel", "previous_panel", "shift+tab", "back", "Focus the previous panel"),
    Command("zoom", "zoom", "z", "zoom", "Maximise the focused panel, or put it back"),
    Command("search", "search", "slash", "search", "Search the trainer log (n / N: next / previous match)"),
    Command("log_scale", "log_scale", "l", "log y", "Loss plot: a log scale, or back to linear"),
    Command(
        "recent_window",
        "recent_window",
        "f",
        "recent",
        "Loss plot: fit the recent fifth of the run, or back to the whole run",
    ),
    Command("theme", "next_theme", "t", "theme", "Switch to the next theme"),
    Command("help", "help", "question_mark", "help", "Every key, what it does and whether it applies now"),
    Command("quit", "quit", "q", "quit", "Close the control room (the run and its keeper go on)"),
)
BY_ACTION: dict[str, Command] = {c.action: c for c in COMMANDS}


# The number keys: 1..9, then 0, to the panels in Tab's order (each border shows its number).
JUMP_KEYS: tuple[str, ...] = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "0")


def binding_id(command: Command) -> str:
    return ID_PREFIX + command.name


def bindings() -> list[Binding]:
    """The app's bindings, off the footer: the key strip shows what applies (see `key_strip`)."""
    return [
        # Tab moves between the panels, not through Textual's focus chain (which skips a panel
        # the layout hid): a priority binding, as the screen's own tab binding would win.
        Binding(
            c.key,
            c.action,
            c.label,
            show=False,
            id=binding_id(c),
            tooltip=c.tooltip,
            priority=c.name in ("next_panel", "previous_panel"),
        )
        for c in COMMANDS
    ] + [
        Binding(
            key,
            f"jump({i})",
            f"panel {key}",
            show=False,
            id=f"{ID_PREFIX}jump_{key}",
            tooltip=f"Focus the panel numbered {key} in its border (zoomed when the layout hides it)",
        )
        for i, key in enumerate(JUMP_KEYS, start=1)
    ]


# The room's own commands a box on top holds back: while a result, a confirmation, a finding's
# detail or the help is open, a stray `t` must not change (and save) the theme behind it, nor Tab
# move the panels' focus. Quitting stays (the box binds `q` itself; Ctrl+Q still quits).
HELD_BY_A_BOX: frozenset[str] = frozenset({c.action for c in COMMANDS if c.action != "quit"} | {"jump"})


def held_by_a_box(screen: object, action: str) -> bool:
    """Whether `action` of the room is held back because a box of ours (a modal screen, not
    Textual's command palette) is on top."""
    from textual.screen import ModalScreen, SystemModalScreen

    return (
        isinstance(screen, ModalScreen)
        and not isinstance(screen, SystemModalScreen)
        and action in HELD_BY_A_BOX
    )


class KeymapError(Exception):
    """A `[keys]` table that cannot be used (one line: file, the command, the key)."""


def keymap_of(keys: Keys, source: str = "trainroom.toml") -> dict[str, str]:
    """`[keys]` as Textual's keymap (binding id -> keys); one printable character is taken as
    the key it types (`/` is `slash`). Two commands on one key is refused, naming both."""
    given = keys.given()
    keymap = {
        ID_PREFIX + name: ",".join(_key_name(k.strip()) for k in value.split(","))
        for name, value in given.items()
    }
    taken: dict[str, str] = dict.fromkeys(JUMP_KEYS, "the panel numbers")
    for c in COMMANDS:
        for k in keymap.get(binding_id(c), c.key).split(","):
            other = taken.get(k)
            if other is not None:
                raise KeymapError(
                    f"{source}: keys: {other} and {c.name} are both on {key_label(k)!r}: give one another key"
                )
            taken[k] = c.name
    return keymap


def _key_name(key: str) -> str:
    return _character_to_key(key) if len(key) == 1 else key


def key_of(action: str, keymap: Mapping[str, str]) -> str:
    """The first key an app action is on now (the keymap's, else the default)."""
    c = BY_ACTION[action]
    return keymap.get(binding_id(c), c.key).split(",")[0]


def key_label(key: str) -> str:
    """How a key is written on screen: `^k`, `R`, `?`, `/`, `tab`."""
    *mods, base = key.split("+") if len(key) > 1 else [key]
    text = format_key(base)
    if "ctrl" in mods:
        mods.remove("ctrl")
        text = "^" + text
    return "+".join([*mods, text])
