"""Lines that wrap at spaces and after a path's `/`, never mid-name, to the width they get."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text

from trainroom.tui.evidence import soft_wrap


class WrappedLines:
    """A rich renderable: each line cut by `evidence.soft_wrap` to the width it is given."""

    def __init__(self, lines: list[str], style: Style | str = "") -> None:
        self.lines = lines
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        out = [piece for line in self.lines for piece in soft_wrap(line, width)]
        yield Text("\n".join(out), style=self.style, no_wrap=True, overflow="crop")
