"""The trainer's log (stdout and stderr of every attempt): its last lines, scrollable, searchable.

It follows the end like `less +F` until scrolled up; G (End) follows again. `/` searches (the
app asks for the text), n goes to the next older match, N to the next newer one.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.reactive import reactive

from .base import Panel


class LogTailPanel(Panel[tuple[str, ...]]):
    TITLE = "trainer.log"
    WAITING = "no trainer log yet"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next_match(-1)", "older match", show=False, id="trainroom.log.next_match"),
        Binding("N", "next_match(1)", "newer match", show=False, id="trainroom.log.previous_match"),
    ]

    following: reactive[bool] = reactive(True)
    """At the end, moving with it as lines come."""
    pattern: reactive[str] = reactive("")
    """What `/` searched for ("" none): its matches are marked."""
    match_line: int | None = None  # the line the search is on (an index into the view)

    def render(self) -> RenderableType:
        # Only the window is built: the tail may hold thousands of lines.
        self._styles = {}
        view = self.view
        if view is None:
            return Text(self.WAITING, style=self.style("dim"))
        n = self._lines_total = len(view)
        height = self.inner_height
        if self.following:
            self.set_reactive(LogTailPanel.scroll_at, max(n - height, 0))
        start = min(self.scroll_at, max(n - height, 0))
        title = "trainer.log" + ("" if self.following or n <= height else "  (scrolled: G follows)")
        if self.pattern:
            title += f"  /{self.pattern}"
        if self.border_title != title:
            self.border_title = title
        self._set_subtitle(f"{start + 1}–{min(start + height, n)} of {n}" if n > height else "")
        t = Text(no_wrap=True, overflow="ellipsis")
        needle = self.pattern.lower()
        for i in range(start, min(start + height, n)):
            line = view[i]
            if i > start:
                t.append("\n")
            low = line.lower()
            level = "crit" if ("error" in low or "traceback" in low) else "value"
            at = len(t)
            # Plain text, never markup: a trainer may print anything.
            t.append(line, style=self.style(level))
            if needle:
                style = self.style("cursor" if i == self.match_line else "match")
                pos = low.find(needle)
                while pos >= 0:
                    t.stylize(style, at + pos, at + pos + len(needle))
                    pos = low.find(needle, pos + len(needle))
        return t

    def action_scroll_lines(self, n: int) -> None:
        super().action_scroll_lines(n)
        self.following = self.scroll_at >= self.max_scroll

    def action_scroll_home(self) -> None:
        self.following = False
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.following = True
        super().action_scroll_end()

    def search(self, pattern: str) -> bool:
        """Go to the newest line holding `pattern` (case-insensitive); False when none does."""
        self.pattern = pattern
        self.match_line = None
        return self._go(len(self.view or ()), -1)

    def action_next_match(self, direction: int) -> None:
        if not self.pattern:
            self.notify("no search yet: / searches the trainer log", timeout=3)
            return
        start = self.match_line if self.match_line is not None else len(self.view or ())
        if not self._go(start, direction):
            where = "older" if direction < 0 else "newer"
            self.notify(f"no {where} line holds {self.pattern!r}", timeout=3, markup=False)

    def _go(self, start: int, direction: int) -> bool:
        view = self.view or ()
        needle = self.pattern.lower()
        i = start + direction
        while 0 <= i < len(view):
            if needle in view[i].lower():
                self.match_line = i
                self.following = False
                # The match a third of the way down: the lines after it are the context.
                self.scroll_at = min(max(i - self.inner_height // 3, 0), self.max_scroll_for(len(view)))
                self.refresh()
                return True
            i += direction
        return False

    def max_scroll_for(self, n: int) -> int:
        return max(n - self.inner_height, 0)
