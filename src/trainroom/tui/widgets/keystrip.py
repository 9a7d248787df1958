"""The key strip, the last line: the keys that act now, as many whole entries as fit (never a cut
one: at 40 columns it is a few keys and `? help`), and help and quit last. Replaces Textual's
footer, which shows only what it can fit and could not tell an action that cannot act (it must
still run, to say why) from one that can.

When space is short the keys a person moves with (Tab, `/`, `o`, `z`) stay and the rarely needed
actions (`C reclaim`) go first: the strip is filled by priority — the fixes the findings offer,
then moving, then every other action that can act — and drawn in that same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text

from trainroom.tui.bindings import KEEPER_ACTIONS
from trainroom.tui.verdict import FindingRow

from .base import Panel

# Moving through the room, in the order the strip shows them: what a k9s or lazygit user looks
# for first (and what a first-time user needs to find everything else).
MOVING: tuple[tuple[str, str], ...] = (
    ("next_panel", "panels"),
    ("search", "search"),
    ("runs", "runs"),
    ("zoom", "zoom"),
)


@dataclass(frozen=True)
class StripKey:
    key: str  # as the screen writes it: `^k`, `R`, `tab`
    what: str  # what it does: "kill pid 4974, the second trainer"
    short: str  # the same in a word, when the strip is short of room: "kill"


@dataclass(frozen=True)
class KeyStripView:
    keys: tuple[StripKey | tuple[str, str], ...]  # most needed first; a pair is (key, what), no short word
    tail: tuple[tuple[str, str], ...]  # always shown when there is room: help, quit


def key_strip_view(
    rows: Iterable[FindingRow],
    refusals: Mapping[str, str | None],
    key_text: Callable[[str], str],
    first: Iterable[tuple[str, str]] = (),
) -> KeyStripView:
    """The strip's entries: `first` (the key that cancels a running action), the fixes the open
    findings offer, then the keys that move, then every other keeper action that can act now;
    help and quit as the tail."""
    keys: list[StripKey] = [StripKey(key, what, what) for key, what in first]
    offered: set[str] = set()
    for r in rows:
        if r.key and r.action:
            offered.add(r.action)
            if r.fix and all((k.key, k.what) != (r.key, r.fix) for k in keys):
                keys.append(StripKey(r.key, r.fix, r.action))
    keys += [StripKey(key_text(action), label, label) for action, label in MOVING]
    keys += [
        StripKey(key_text(a), a, a) for a in KEEPER_ACTIONS if refusals.get(a) is None and a not in offered
    ]
    return KeyStripView(keys=tuple(keys), tail=((key_text("help"), "help"), (key_text("quit"), "quit")))


def _width(entries: Iterable[tuple[str, str]]) -> int:
    return sum(cell_len(f"{key} {what}") + 2 for key, what in entries)


def fit_keys(view: KeyStripView, width: int) -> list[tuple[str, str]]:
    """The entries shown in `width` columns: whole ones, in priority order. A fix is said in a
    word (`^k kill`) when its whole words would push a moving key off the strip; an entry that
    does not fit is left out and a shorter one after it may still fit."""
    moving = {label for _, label in MOVING}
    keys = [k if isinstance(k, StripKey) else StripKey(k[0], k[1], k[1]) for k in view.keys]
    first = [k for k in keys if k.what != k.short or k.what in moving]
    whole = [(k.key, k.what) for k in first]
    long = _width([*whole, *view.tail]) > width
    room = width - _width(view.tail)
    chosen: list[tuple[str, str]] = []
    for k in keys:
        entry = (k.key, k.short if long else k.what)
        n = _width([entry])
        if n <= room:
            chosen.append(entry)
            room -= n
    return [*chosen, *view.tail]


class KeyStrip(Panel[KeyStripView], can_focus=False):
    WAITING = ""

    def render_view(self, view: KeyStripView) -> RenderableType:
        width = self.inner_width
        t = Text(no_wrap=True, overflow="crop")
        for key, what in fit_keys(view, width):
            if cell_len(t.plain) + cell_len(f"{key} {what}") > width:
                break
            t.append(key, style=self.style("info"))
            t.append(f" {what}  ", style=self.style("label"))
        t.rstrip()
        return t
