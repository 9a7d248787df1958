"""The base of every panel: a widget that renders one view, draws in theme colours only, takes
the focus and scrolls.

Scrolling is a window over the panel's lines (`scroll_at`, the first one shown), not a Textual
scroll container: a panel renders only what fits, so a 2,000-line log tail costs what its
visible lines cost. j/k and the arrows move a line, PgUp/PgDn a page, g/G (Home/End) to the
ends, the mouse wheel three lines. (No single letter here that the app uses for an action: a
focused panel's keys come first.)
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

from rich.console import RenderableType
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.content import ContentType
from textual.reactive import reactive
from textual.widget import Widget, _BorderTitle

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
    "cursor",
    "match",
)

WHEEL_LINES = 3

# Tab's order through the panels (by widget id), the compact layout's hidden ones last; the
# number keys follow it (1..9, then 0), and each border shows its number before the title, as
# btop marks its boxes.
PANEL_ORDER = ("findings", "trainer", "vram", "cadence", "lr", "loss", "host", "disk", "ranks", "log")
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def jump_mark(panel_id: str | None) -> str:
    """The number a panel's border shows ("³" for the third panel), or "" for none."""
    if panel_id not in PANEL_ORDER:
        return ""
    return str((PANEL_ORDER.index(panel_id) + 1) % 10).translate(_SUPERSCRIPT)


class _NumberedTitle(_BorderTitle):
    """A panel's border title with its number before it. Read back without the number, so a panel
    compares its own words; set only when the words change (setting repaints)."""

    def __set__(self, obj: Widget, title: Text | ContentType | None) -> None:
        mark = jump_mark(obj.id)
        if mark and isinstance(title, str) and title and not title.startswith(mark):
            title = mark + title
        old = getattr(obj, self._internal_name, None)
        if isinstance(title, str) and old is not None and old.markup == title:
            return
        super().__set__(obj, title)

    def __get__(self, obj: Widget, objtype: type[Widget] | None = None) -> str | None:
        title = super().__get__(obj, objtype)
        mark = jump_mark(obj.id)
        return title.removeprefix(mark) if title is not None and mark else title


ViewT = TypeVar("ViewT")


class Panel(Widget, Generic[ViewT], can_focus=True):
    """One panel of the control room. Data flows down: the app sets `view`; the panel renders it.
    `ViewT` is the frozen view it draws (from `figures`, mostly)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "scroll_lines(1)", "down", show=False, id="trainroom.panel.down"),
        Binding("k,up", "scroll_lines(-1)", "up", show=False, id="trainroom.panel.up"),
        Binding("pagedown,space", "scroll_pages(1)", "page down", show=False, id="trainroom.panel.page_down"),
        Binding("pageup", "scroll_pages(-1)", "page up", show=False, id="trainroom.panel.page_up"),
        Binding("g,home", "scroll_home", "top", show=False, id="trainroom.panel.top"),
        Binding("G,end", "scroll_end", "bottom", show=False, id="trainroom.panel.bottom"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {f"panel--{name}" for name in PANEL_STYLES}
    TITLE: ClassVar[str] = ""
    WAITING: ClassVar[str] = "waiting for the keeper…"

    border_title = _NumberedTitle()

    view: reactive[ViewT | None] = reactive(None)
    """The frozen view; None until the first snapshot arrives."""
    scroll_at: reactive[int] = reactive(0)
    """The first line shown: the panel's scroll position."""

    _styles: dict[str, Style]
    _lines_total = 0  # how many lines the last render had (for the bounds and the subtitle)

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
        self._styles = {}
        if self.view is None:
            return Text(self.WAITING, style=self.style("dim"))
        return self.window(self.render_view(self.view))

    def render_view(self, view: ViewT) -> RenderableType:
        raise NotImplementedError

    def window(self, content: RenderableType) -> RenderableType:
        """The lines from `scroll_at` that fit; a panel whose content fits is left as it is."""
        if not isinstance(content, Text):
            return content
        lines = content.split("\n", allow_blank=True)
        self._lines_total = n = len(lines)
        height = self.inner_height
        if n <= height:
            self._set_subtitle("")
            return content
        start = min(self.scroll_at, n - height)
        self._set_subtitle(f"{start + 1}–{start + height} of {n}")
        return Text("\n").join(lines[start : start + height])

    def _set_subtitle(self, text: str) -> None:
        if self.border_subtitle != text:
            self.border_subtitle = text

    # ------------------------------------------------------------------ scrolling

    @property
    def max_scroll(self) -> int:
        return max(self._lines_total - self.inner_height, 0)

    def action_scroll_lines(self, n: int) -> None:
        self.scroll_at = min(max(self.scroll_at + n, 0), self.max_scroll)

    def action_scroll_pages(self, n: int) -> None:
        self.action_scroll_lines(n * max(self.inner_height - 1, 1))

    def action_scroll_home(self) -> None:
        self.scroll_at = 0

    def action_scroll_end(self) -> None:
        self.scroll_at = self.max_scroll

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.action_scroll_lines(WHEEL_LINES)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.action_scroll_lines(-WHEEL_LINES)

    def on_click(self, event: events.Click) -> None:
        self.focus()

    # Small builders the panels share.
    def pair(self, text: Text, label: str, value: str, level: str = "value") -> Text:
        text.append(label + " ", style=self.style("label"))
        text.append(value, style=self.style(level))
        return text
