"""The base of every panel: a widget that renders one view and draws in theme colours only."""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from rich.console import RenderableType
from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

# Levels a figure is drawn at, and the drawing parts the panels share; each is a component
# class styled in control_room.tcss from the theme's variables.
PANEL_STYLES = (
    "ok",
    "info",
    "warn",
    "crit",
    "dim",
    "label",
    "value",
    "curve",
    "lnv",
    "mark",
    "axis",
    "bar-driver",
    "bar-allocator",
    "bar-empty",
)


ViewT = TypeVar("ViewT")


class Panel(Widget, Generic[ViewT]):
    """One panel of the control room. Data flows down: the app sets `view`; the panel renders it.
    `ViewT` is the frozen view it draws (from `figures`, mostly)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"panel--{name}" for name in PANEL_STYLES}
    TITLE: ClassVar[str] = ""
    WAITING: ClassVar[str] = "waiting for the keeper…"

    view: reactive[ViewT | None] = reactive(None)
    """The frozen view; None until the first snapshot arrives."""

    _styles: dict[str, Style]

    def on_mount(self) -> None:
        self._styles = {}
        if self.TITLE:
            self.border_title = self.TITLE

    def style(self, name: str) -> Style:
        # Looked up once a render: a panel asks for the same few styles dozens of times.
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"panel--{name}", partial=True)
        return style

    @property
    def inner_width(self) -> int:
        return max(self.content_size.width, 1)

    @property
    def inner_height(self) -> int:
        return max(self.content_size.height, 1)

    def render(self) -> RenderableType:
        self._styles: dict[str, Style] = {}
        if self.view is None:
            return Text(self.WAITING, style=self.style("dim"))
        return self.render_view(self.view)

    def render_view(self, view: ViewT) -> RenderableType:
        raise NotImplementedError

    # Small builders the panels share.
    def pair(self, text: Text, label: str, value: str, level: str = "value") -> Text:
        text.append(label + " ", style=self.style("label"))
        text.append(value, style=self.style(level))
        return text
