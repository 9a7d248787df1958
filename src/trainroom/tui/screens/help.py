"""The help screen: every key, what it does and whether it applies right now (and why not), one
line a key in groups (act on the run, move, the loss plot, the room, a focused panel's own), as
k9s and lazygit list theirs. A line that does not fit ends in an ellipsis rather than wrapping
(at 80x24 a wrapped table held four keys a screen); the table scrolls (j/k, PgUp/PgDn, g/G)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from trainroom.tui.bindings import COMMANDS, DESTRUCTIVE, JUMP_KEYS, KEEPER_ACTIONS, key_label, key_of

# The control room's own commands by group, in the order the help lists them.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("while an action runs", ("cancel_action",)),
    ("move", ("next_panel", "previous_panel", "zoom", "search", "runs", "processes", "history")),
    ("loss plot", ("log_scale", "recent_window")),
    ("the room", ("command_line", "next_theme", "options", "help", "quit")),
)

# The panels' own keys (a focused panel takes them first).
PANEL_KEYS = (
    ("j/k ↓/↑", "Scroll the focused panel a line (findings: move the cursor)"),
    ("PgDn/PgUp", "Scroll a page (space too)"),
    ("g/G", "To the top / the end, Home/End too (the log follows the end again)"),
    ("enter", "Findings: the finding whole, its evidence, its action and target"),
    ("n/N", "Trainer log: the next older / newer match of the search"),
    ("wheel", "Scroll the panel under the pointer; a click focuses it"),
    ("shift+drag", "Select text (the terminal's own selection, past the app's mouse)"),
    ("ctrl+p", "Command palette: every command above, searchable"),
)

NOTE = (
    "Keys that change the world are capitals or a ctrl chord (^k kills, as in k9s), never a key a "
    "vim, k9s or lazygit user moves with; each asks first, showing the exact target. A key that "
    "cannot act says why. With the findings focused, a fix key acts on the finding under the cursor. "
    'Remap any key in trainroom.toml under [keys] (e.g. kill = "ctrl+k").'
)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,question_mark,q",
            "close",
            "close",
            id="trainroom.help.close",
            tooltip="Back to the control room",
        ),
        Binding("j,down", "scroll(1)", "down", show=False, id="trainroom.help.down"),
        Binding("k,up", "scroll(-1)", "up", show=False, id="trainroom.help.up"),
        Binding("pagedown,space", "scroll(10)", "page down", show=False, id="trainroom.help.page_down"),
        Binding("pageup", "scroll(-10)", "page up", show=False, id="trainroom.help.page_up"),
        Binding("G,end", "end", "end", show=False, id="trainroom.help.end"),
        Binding("g,home", "home", "home", show=False, id="trainroom.help.home"),
    ]

    def __init__(self, why_not: Mapping[str, str | None], keymap: Mapping[str, str]) -> None:
        super().__init__()
        self.why_not = why_not
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        table = Table(box=None, padding=(0, 2, 0, 0), show_header=False, expand=True)
        table.add_column("key", no_wrap=True, min_width=9, max_width=12)
        table.add_column("does", ratio=1, no_wrap=True, overflow="ellipsis")
        table.add_column("now", ratio=1, no_wrap=True, overflow="ellipsis")
        by_action = {c.action: c for c in COMMANDS}

        def heading(title: str) -> None:
            table.add_row("", Text(title, style="bold"), "")

        heading("act on the run (each asks first)")
        for action in KEEPER_ACTIONS:
            c = by_action[action]
            why = self.why_not.get(action)
            does = c.tooltip + (" (asks first)" if action in DESTRUCTIVE else "")
            now = Text(f"not now: {why}", style="dim") if why else Text("ready")
            table.add_row(key_label(key_of(action, self.keymap)), does, now)
        for title, actions in GROUPS:
            heading(title)
            for action in actions:
                c = by_action[action]
                table.add_row(key_label(key_of(action, self.keymap)), c.tooltip, "")
            if title == "move":
                table.add_row(
                    f"{JUMP_KEYS[0]}-{JUMP_KEYS[-2]} {JUMP_KEYS[-1]}",
                    "Focus the panel with that number in its border (0: the tenth)",
                    "",
                )
        heading("in a focused panel")
        for key, does in PANEL_KEYS:
            table.add_row(key, does, "")
        with Vertical(id="help-box", classes="modal-box"):
            yield Label("trainroom keys", id="help-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(table, id="help-table")
                yield Static(NOTE, id="help-note", classes="modal-hint", markup=False)
            yield Label("esc: close · j/k, PgUp/PgDn, g/G: scroll", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll(self, lines: int) -> None:
        self.query_one("#help-scroll", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_end(self) -> None:
        self.query_one("#help-scroll", VerticalScroll).scroll_end(animate=False)

    def action_home(self) -> None:
        self.query_one("#help-scroll", VerticalScroll).scroll_home(animate=False)
