"""Findings: the open ones as rows (`run.causes.fold`: a root cause, what follows from it indented
under it with its count, one code's repeats one line), most severe first, then newest, each with
the key of its action and that action's target when it can act; then the resolved ones. A cursor
picks one: it is shown whole (the others one line each), Enter opens its detail, and a targeted
fix key acts on it. The cursor stays on its finding, wherever new rows put it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive

from trainroom.core.vocab import SEVERITY_RANK
from trainroom.tui import fmt
from trainroom.tui.verdict import SEVERITY_LEVEL, SEVERITY_WORD, FindingRow, FindingsView

from .base import Panel


class FindingsPanel(Panel[FindingsView]):
    TITLE = "findings"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "detail", show=False, id="trainroom.findings.open"),
    ]

    @dataclass
    class Open(Message):
        """Enter on a finding: the app shows its detail."""

        row: FindingRow

    selected: reactive[str | None] = reactive(None)
    """The ident of the finding under the cursor (None: the first, the most severe). A row is
    under the cursor while it stands for that finding, wherever new rows put it."""

    _to_cursor = False  # the cursor moved: the next render scrolls to it
    _at = 0  # the cursor's row when last drawn: where it stays when its finding closes

    def watch_selected(self) -> None:
        self._to_cursor = True

    def on_focus(self) -> None:
        self._hold()  # the cursor shows from now on: it stays on what it shows
        self.refresh()  # the cursor is drawn only while the list has the focus

    def on_blur(self) -> None:
        self.refresh()

    def watch_view(self) -> None:
        if self.has_focus:
            self._hold()

    def _hold(self) -> None:
        """Pin the cursor to a finding: the one it is on, or (its finding closed, or none chosen
        yet) the one now in its place."""
        rows = self.view.open if self.view is not None else ()
        if rows and not any(self.selected in r.idents for r in rows):
            self.set_reactive(FindingsPanel.selected, rows[min(self._at, len(rows) - 1)].ident)

    def selected_row(self) -> FindingRow | None:
        rows = self.view.open if self.view is not None else ()
        return rows[self._cursor()] if rows else None

    def _cursor(self) -> int:
        rows = self.view.open if self.view is not None else ()
        return next(
            (i for i, r in enumerate(rows) if self.selected in r.idents), min(self._at, max(len(rows) - 1, 0))
        )

    def action_scroll_lines(self, n: int) -> None:
        rows = self.view.open if self.view is not None else ()
        if not rows:
            super().action_scroll_lines(n)
            return
        i = min(max(self._cursor() + n, 0), len(rows) - 1)
        if i == self._cursor() and n > 0:
            super().action_scroll_lines(n)  # past the last open one: on into the history
            return
        self.selected = rows[i].ident

    def action_scroll_home(self) -> None:
        rows = self.view.open if self.view is not None else ()
        self.selected = rows[0].ident if rows else None
        super().action_scroll_home()

    def action_open(self) -> None:
        row = self.selected_row()
        if row is None:
            self.notify("no open finding to show", timeout=3)
        else:
            self.post_message(self.Open(row))

    def render_view(self, view: FindingsView) -> RenderableType:
        n = len(view.open)
        self.border_title = f"findings ({n})" if n else "findings"
        width = self.inner_width
        lines: list[Text] = []
        cursor = self._cursor()
        first_line = cursor_lines = 0
        if not view.open:
            lines.append(Text("none open", style=self.style("dim")))
        self._at = cursor
        texts = [self._row_texts(row, i == cursor and self.has_focus) for i, row in enumerate(view.open)]
        wrapped = [[w for i, t in enumerate(ts) for w in self._wrap(t, width, 4 if i else 0)] for ts in texts]
        # Every finding whole when they fit; else the others one line a code and the cursor's as
        # whole as the panel holds (its consequences' lines always; the list scrolls to it).
        whole = sum(len(w) for w in wrapped) <= self.inner_height
        for i, ts in enumerate(texts):
            if i == cursor:
                first_line = len(lines)
                shown = wrapped[i] if whole else self._fitted(view.open[i], ts, width, self.inner_height)
                cursor_lines = len(shown)
                lines.extend(shown)
            elif whole:
                lines.extend(wrapped[i])
            else:
                for text in ts:
                    text.truncate(width, overflow="ellipsis")
                    lines.append(text)
        if view.resolved:
            lines.append(Text(f"resolved ({len(view.resolved)})", style=self.style("label")))
            for r in view.resolved:
                t = Text(no_wrap=True, overflow="ellipsis")
                t.append(f"✓ {fmt.clock(r.cleared_at)} ", style=self.style("dim"))
                t.append(r.code, style=self.style(SEVERITY_LEVEL.get(r.severity, "info")))
                t.append(f"  {r.message}", style=self.style("dim"))
                t.truncate(width, overflow="ellipsis")
                lines.append(t)
        # Keep the cursor's finding in view when it moved.
        height = self.inner_height
        top = self.scroll_at
        if self._to_cursor:
            top = min(top, first_line)
            top = max(top, first_line + min(cursor_lines, height) - height)
        self._to_cursor = False
        if top != self.scroll_at:
            self.set_reactive(FindingsPanel.scroll_at, max(top, 0))
        return Text("\n").join(lines)

    def _fitted(self, row: FindingRow, texts: list[Text], width: int, height: int) -> list[Text]:
        """A row in `height` lines where it can be: what follows from its cause one line each
        (the count and the severity of each stay in view), its own words wrapped in what is left,
        the last of them cut with an ellipsis. Where even one line each is too many, the most
        severe consequences keep theirs, in their order, and one line names the rest."""
        head, follow = texts[0], texts[1:]
        wrapped = [w for i, t in enumerate(texts) for w in self._wrap(t, width, 4 if i else 0)]
        if len(wrapped) <= height:
            return wrapped
        if 1 + len(follow) > height and len(follow) > 1:
            room = max(height - 2, 0)  # the head, and the line that names the rest
            by_worst = sorted(range(len(follow)), key=lambda i: -SEVERITY_RANK.get(row.follow[i].severity, 0))
            kept = sorted(by_worst[:room])
            rest = [row.follow[i] for i in sorted(by_worst[room:])]
            more = Text("  ↳ ", style=self.style("dim"))
            more.append(f"+{len(rest)} more: " + ", ".join(k.code for k in rest), style=self.style("dim"))
            follow = [follow[i] for i in kept] + [more]
        own = self._wrap(head, width, 0)
        keep = max(1, height - len(follow))
        if len(own) > keep:
            own = own[:keep]
            own[-1].truncate(max(width - 1, 1))
            own[-1].append("…")
        for t in follow:
            t.truncate(width, overflow="ellipsis")
        return [*own, *follow]

    def _wrap(self, text: Text, width: int, indent: int) -> list[Text]:
        """`text` wrapped to `width`, its continuation lines indented by `indent` (a line that
        follows from a cause reads as one block under it)."""
        lines = list(text.wrap(self.app.console, max(width - indent, 8), overflow="fold"))
        for line in lines[1:]:
            line.pad_left(indent)
        return lines

    def _row_texts(self, row: FindingRow, focused: bool) -> list[Text]:
        """The row's line, then one line for each code that follows from it, indented under it."""
        t = Text()
        t.append(SEVERITY_WORD.get(row.severity, row.severity.upper()) + " ", style=self.style(row.level))
        t.append(row.code, style=self.style(row.level))
        if row.key and row.fix:
            t.append(f" [{row.key}] {row.fix}", style=self.style("info"))
        t.append("  " + row.message, style=self.style("value"))
        out = [t]
        for k in row.follow:
            u = Text("  ↳ ", style=self.style("dim"))
            u.append(SEVERITY_WORD.get(k.severity, k.severity.upper()) + " ", style=self.style(k.level))
            u.append(k.since, style=self.style("value"))
            u.append(f"; the latest: {k.messages[0]}", style=self.style("dim"))
            out.append(u)
        if focused:
            for x in out:
                x.stylize(self.style("cursor"))
        return out
