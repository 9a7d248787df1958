"""The header: which run, which attempt, and the verdict as a badge: the state in words, coloured
by the worse of the state and the worst open finding, which is named beside it. Green only when
nothing is wrong."""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from rich.console import RenderableType
from rich.style import Style
from rich.text import Text

from trainroom.tui import fmt
from trainroom.tui.verdict import HeaderView

from .base import PANEL_STYLES, Panel

LEVELS = ("ok", "info", "warn", "crit", "dim")


class RunHeader(Panel[HeaderView], can_focus=False):
    COMPONENT_CLASSES: ClassVar[set[str]] = (
        {f"panel--{n}" for n in PANEL_STYLES}
        | {f"header--level-{level}" for level in LEVELS}
        | {"header--brand", "header--offline"}
    )
    WAITING = "trainroom · looking for a run…"

    def render_view(self, view: HeaderView) -> RenderableType:
        """Parts chosen by importance, shown in reading order; one that does not fit is left out
        whole, so the header never ends in half a word. The reason, last, keeps whole words."""
        label, value = self.style("label"), self.style("value")
        badge = self.get_component_rich_style(f"header--level-{view.level}")
        Part = list[tuple[str, Style]]
        # (importance: 0 first, the part) in reading order
        parts: list[tuple[int, Part]] = [
            (0, [(" trainroom ", self.get_component_rich_style("header--brand")), (" ", label)]),
            (2, [(view.run_id, value)]),
        ]
        if view.attempt is not None:
            parts.append((4, [("  attempt ", label), (f"{view.attempt}/{view.attempts}", value)]))
        # The badge carries the state in words, so it reads the same without colour.
        parts.append(
            (
                1,
                [
                    ("  ", label),
                    (f" {view.state.upper()} ", badge),
                    # A process trainroom did not start: said beside its state, in words.
                    (" attached" * view.attached, label),
                ],
            )
        )
        if view.worst_code is not None:
            extra = f" +{view.more}" if view.more else ""
            where = [(f" {view.worst_where}", self.style(view.worst_level))] if view.worst_where else []
            parts.append(
                (1, [(" ", label), (view.worst_code, self.style(view.worst_level)), *where, (extra, label)])
            )
        if not view.connected:
            said = " KEEPER BUSY " if view.keeper_busy else " KEEPER GONE "
            parts.append((1, [(" ", label), (said, self.get_component_rich_style("header--offline"))]))
        # "for N" is the age of what it follows: the finding named beside the state (since it was
        # first seen), else the state's own.
        age = view.worst_age_s if view.worst_code is not None else view.state_age_s
        if age is not None:
            parts.append((5, [(f" for {fmt.duration(age)}", label)]))
        if view.step is not None:
            parts.append((3, [("  step ", label), (str(view.step), value)]))
        width = self.size.width or 10_000
        used, chosen = 0, set()
        for i, (_, part) in sorted(enumerate(parts), key=lambda ip: ip[1][0]):
            n = sum(cell_len(s) for s, _ in part)
            if used + n <= width:
                used += n
                chosen.add(i)
        t = Text(no_wrap=True, overflow="crop")
        for i, (_, part) in enumerate(parts):
            if i in chosen:
                for s, style in part:
                    t.append(s, style=style)
        if view.reason and len(chosen) == len(parts):
            room = width - t.cell_len - 2
            words = view.reason.split()
            kept: list[str] = []
            for i, w in enumerate(words):
                more = i + 1 < len(words)
                if cell_len(" ".join([*kept, w])) + (2 if more else 0) > room:
                    break
                kept.append(w)
            if kept:
                cut = len(kept) < len(words)
                t.append("  " + " ".join(kept) + (" …" if cut else ""), style=label)
        return t
