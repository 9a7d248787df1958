"""The room's first screen opens with the breakpoint classes its size gives (`-wide`, `-tall`...),
so the first Resize finds them already set: otherwise Textual sets them after every panel has
been styled, and styles the whole room again: a full style pass of ~80 widgets, a third of the
style work before the first frame (docs/benchmarks.md)."""

from __future__ import annotations

from textual.app import App
from textual.screen import Screen


def breakpoint_classes(width: int, height: int, app: App[object]) -> dict[str, bool]:
    """Each breakpoint class of `app` and whether a screen of this size has it, as the screen's
    Resize handler decides (the largest breakpoint at or under the size)."""
    classes: dict[str, bool] = {}
    for size, points in ((width, app.HORIZONTAL_BREAKPOINTS or []), (height, app.VERTICAL_BREAKPOINTS or [])):
        chosen = next((name for at, name in sorted(points, reverse=True) if size >= at), None)
        classes |= {name: name == chosen for _, name in points}
    return classes


class SizedFirstScreen:
    """A mixin for an App: its default screen starts with the classes of the terminal's size."""

    def get_default_screen(self) -> Screen[object]:
        assert isinstance(self, App)
        screen: Screen[object] = Screen(id="_default")
        width, height = self.size
        screen.update_classes(breakpoint_classes(width, height, self), update=False)
        return screen
