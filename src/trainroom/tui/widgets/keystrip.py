"""The key strip, the last line: the keys that act now, the most useful first, as many whole
entries as fit (never a cut one: at 40 columns it is a few keys and `? help`), and the command
palette last when there is room. Replaces Textual's footer, which shows only what it can fit and
could not tell an action that cannot act (it must still run, to say why) from one that can."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text

from .base import Panel


@dataclass(frozen=True)
class KeyStripView:
    keys: tuple[tuple[str, str], ...]  # (key label, what it does), in order of use
    tail: tuple[tuple[str, str], ...]  # always shown when there is room: help, quit


class KeyStrip(Panel[KeyStripView], can_focus=False):
    WAITING = ""

    def render_view(self, view: KeyStripView) -> RenderableType:
        width = self.inner_width
        tail = [f"{k} {what}" for k, what in view.tail]
        room = width - sum(cell_len(x) + 2 for x in tail)
        chosen: list[tuple[str, str]] = []
        for key, what in view.keys:
            n = cell_len(f"{key} {what}") + 2
            if n <= room:
                chosen.append((key, what))
                room -= n
        t = Text(no_wrap=True, overflow="crop")
        for key, what in [*chosen, *view.tail]:
            if cell_len(t.plain) + cell_len(f"{key} {what}") > width:
                break
            t.append(key, style=self.style("info"))
            t.append(f" {what}  ", style=self.style("label"))
        t.rstrip()
        return t
