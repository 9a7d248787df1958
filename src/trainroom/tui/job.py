"""The job screen: every node of a multi-node job at once (`trainroom job --tui`, or `trainroom
job ... --tui` with targets). One `NodeFollower` per node (a thread each: the node's live
subscription, over ssh for a remote one, "unreachable since T" with reconnects on a backoff);
the screen redraws the merged view twice a second: the job's state, its first failure with host
and rank, per node its state, VRAM, host memory and disk, the ranks across hosts (median and
worst step), each node's findings, and which ranks did not arrive when a collective hangs.
Read-only: the job's actions are `trainroom job --kill | --resume | --stacks`.

A Slurm job (`trainroom job slurm:JOBID --tui`, `trainroom job --slurm --tui`) is followed by
core's `SlurmWatch` instead (scontrol through its 3 s cache, one srun step across the nodes per
refresh): the header adds Slurm's line, each node row its Slurm state, the findings Slurm's verdicts.

Drawn like the control room: the same panels (`widgets.base.Panel`), theme colours only (the
shipped themes, `t` cycles them), views computed by a pure function (`jobview.job_screen_view`
of core's `job_dict`), and a key strip as the last line.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path, PurePath
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.console import RenderableType
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType

from trainroom.core.job.nodes import NodeFollower, job_name, node_refs
from trainroom.core.job.slurm import SlurmJobError
from trainroom.core.job.slurmwatch import SlurmWatch
from trainroom.core.job.view import NodeReading, job_dict
from trainroom.core.run.store import RunError

from . import theming
from .jobview import (
    NODE_COLUMNS,
    RANK_COLUMNS,
    SLURM_NODE_COLUMNS,
    JobHead,
    JobScreenView,
    NodeRow,
    Note,
    RankRow,
    job_screen_view,
)
from .widgets.base import Panel
from .widgets.keystrip import KeyStrip, KeyStripView

REDRAW_S = 0.5
GAP = 2  # spaces between table columns
MAX_TABLE = 12  # the most lines the nodes and the findings take; the ranks get the rest


class JobHeader(Panel[JobHead], can_focus=False):
    WAITING = " job: reading the nodes…"

    def render_view(self, view: JobHead) -> RenderableType:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"job {view.job}  ", style=self.style("value") + Style(bold=True))
        t.append(f" {view.state.upper()} ", style=self.style(view.level) + Style(reverse=True))
        self.pair(t, "  nodes", str(view.nodes))
        self.pair(t, "  ranks", str(view.ranks))
        if view.step_median is not None:
            self.pair(t, "  step median", f"{view.step_median:g}")
            self.pair(t, ", worst", str(view.step_worst))
        if view.slurm is not None:
            t.append("\n")
            t.append(view.slurm.line(), style=self.style(view.slurm.level))
        if view.first_failure is not None:
            t.append("\nfirst failure: ", style=self.style("crit"))
            t.append(view.first_failure, style=self.style("value"))
        return t


def table(
    panel: Panel[Any], columns: Sequence[str], rows: Sequence[tuple[tuple[str, ...], dict[int, str]]]
) -> Text:
    """Columns as wide as their widest cell; `rows` are (cells, {cell index: the level colouring it})."""
    widths = [cell_len(c) for c in columns]
    for cells, _ in rows:
        widths = [max(w, cell_len(c)) for w, c in zip(widths, cells, strict=True)]
    t = Text(no_wrap=True, overflow="ellipsis")
    for i, c in enumerate(columns):
        t.append(c.ljust(widths[i] + GAP), style=panel.style("label"))
    for cells, levels in rows:
        t.append("\n")
        for i, c in enumerate(cells):
            t.append(c.ljust(widths[i] + GAP), style=panel.style(levels.get(i, "value")))
    t.rstrip()
    return t


class NodesPanel(Panel[tuple[NodeRow, ...]]):
    TITLE = "nodes"

    def render_view(self, view: tuple[NodeRow, ...]) -> RenderableType:
        if any(n.slurm is not None for n in view):
            return table(
                self, SLURM_NODE_COLUMNS, [(n.cells(), {1: n.level, 3: n.slurm_level}) for n in view]
            )
        return table(self, NODE_COLUMNS, [(n.cells(), {1: n.level}) for n in view])


class JobRanksPanel(Panel[tuple[RankRow, ...]]):
    TITLE = "ranks"

    def render_view(self, view: tuple[RankRow, ...]) -> RenderableType:
        if not view:
            return Text("no rank has reported", style=self.style("dim"))
        return table(self, RANK_COLUMNS, [(r.cells(), {4: r.level}) for r in view])


class NotesPanel(Panel[tuple[Note, ...]]):
    TITLE = "findings"

    def render_view(self, view: tuple[Note, ...]) -> RenderableType:
        if not view:
            return Text("no findings on any node", style=self.style("dim"))
        t = Text()
        for i, note in enumerate(view):
            if i:
                t.append("\n")
            t.append(f"{note.label} ", style=self.style(note.level))
            t.append(note.text, style=self.style("value"))
        return t


def note_lines(notes: Sequence[Note], width: int) -> int:
    """How many lines the findings take, wrapped at `width` cells (one when there are none)."""
    w = max(width, 10)
    return max(1, sum(-(-cell_len(f"{n.label} {n.text}") // w) for n in notes))


class JobRoom(App[int]):
    TITLE = "trainroom job"
    CSS_PATH: ClassVar[list[str | PurePath]] = [
        "control_room.tcss",
        "job.tcss",
    ]  # the panels' theme styles, then the job's layout
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "q", "quit", "quit", id="trainroom.job.quit", tooltip="leave the job screen (the job goes on)"
        ),
        Binding(
            "t",
            "next_theme",
            "theme",
            id="trainroom.job.theme",
            tooltip="the next theme (dark, light, contrast)",
        ),
    ]
    KEYS: ClassVar[KeyStripView] = KeyStripView(
        keys=(("tab", "next panel"), ("j/k", "scroll"), ("t", "theme")), tail=(("q", "quit"),)
    )

    def __init__(
        self,
        job: str | None,
        read: Callable[[], list[NodeReading]],
        *,
        clock: Callable[[], float] = time.time,
        followers: Iterable[NodeFollower] = (),
        slurm: SlurmWatch | None = None,
        theme: str | None = None,
        theme_dirs: Iterable[Path | Traversable] | None = None,
    ) -> None:
        """`read` gives the nodes as last heard (the followers' readings, under their lock);
        `slurm` a Slurm job's watch (its view is merged in under "slurm", as `--json` does)."""
        self.loaded_themes = theming.load_themes(
            theme_dirs if theme_dirs is not None else theming.default_dirs()
        )
        super().__init__()
        self.job = job
        self.read = read
        self.clock = clock
        self.followers = list(followers)
        self.slurm = slurm
        self.view: JobScreenView | None = None
        for t in self.loaded_themes.themes:
            self.register_theme(t)
        self.theme, _ = theming.initial_theme(
            self.loaded_themes, theme, no_color=self.no_color, builtin=self.available_themes.get
        )

    @classmethod
    def following(
        cls, targets: list[str], job: str | None, clock: Callable[[], float] = time.time
    ) -> JobRoom:
        """The screen over live followers of `targets` (raises RunError on a target that names no run)."""
        refs = node_refs(targets)
        name = job_name(refs, job)
        lock = threading.Lock()
        # No wake-up from the followers' threads: the screen redraws on its own interval.
        followers = [NodeFollower(r, name, lock, lambda: None, clock) for r in refs]

        def read() -> list[NodeReading]:
            with lock:
                return [f.reading for f in followers]

        return cls(name, read, clock=clock, followers=followers)

    @classmethod
    def following_slurm(cls, watch: SlurmWatch, clock: Callable[[], float] = time.time) -> JobRoom:
        """The screen over a Slurm job (`watch` already read once: its name is the job's)."""
        return cls(watch.name, watch.readings, clock=clock, slurm=watch)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return theming.app_variables(self.current_theme)

    def action_next_theme(self) -> None:
        names = self.loaded_themes.names() or list(self.available_themes)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]

    def compose(self) -> ComposeResult:
        yield JobHeader(id="job-head")
        yield NodesPanel(id="job-nodes", classes="panel")
        yield JobRanksPanel(id="job-ranks", classes="panel")
        yield NotesPanel(id="job-notes", classes="panel")
        yield KeyStrip(id="key-strip")

    def on_mount(self) -> None:
        for f in self.followers:
            f.start()
        if self.slurm is not None:
            self.slurm.start()
        self.query_one(KeyStrip).view = self.KEYS
        self.set_interval(REDRAW_S, self.redraw)
        self.redraw()

    def on_unmount(self) -> None:
        for f in self.followers:
            f.stop()
        if self.slurm is not None:
            self.slurm.stop()

    def redraw(self) -> None:
        now = self.clock()
        d = job_dict(self.job, self.read(), now)
        if self.slurm is not None:
            d["slurm"] = self.slurm.view(now)
        self.view = v = job_screen_view(d)
        head, nodes, notes = self.query_one(JobHeader), self.query_one(NodesPanel), self.query_one(NotesPanel)
        # A panel renders only the lines that fit (`Panel.window`), so each is sized to its lines
        # (the header's next ones are Slurm's line and the first failure; a node table's first its
        # column names). The findings wrap: sized to their wrapped lines, leaving the ranks five.
        head_h = 1 + (v.head.slurm is not None) + (v.head.first_failure is not None)
        nodes_h = min(len(v.nodes) + 3, MAX_TABLE)
        spare = self.size.height - head_h - nodes_h - 1 - 5
        head.styles.height, nodes.styles.height = head_h, nodes_h
        notes.styles.height = max(3, min(note_lines(v.notes, self.size.width - 4) + 2, MAX_TABLE, spare))
        head.view, nodes.view, notes.view = v.head, v.nodes, v.notes
        self.query_one(JobRanksPanel).view = v.ranks


def run_job_app(args: argparse.Namespace) -> int:
    """`trainroom job [TARGET ...] --tui`: bad input is one line on stderr and exit 2."""
    if not sys.stdout.isatty():
        print("trainroom: the job screen needs a terminal (try `trainroom job --json`)", file=sys.stderr)
        return 2
    try:
        slurm_id = getattr(args, "slurm_job_id", None)
        if slurm_id is not None:
            # The first read here: a job that cannot be shown is one line and exit 2, not a screen.
            watch = SlurmWatch(slurm_id)
            watch.refresh()
            app = JobRoom.following_slurm(watch)
        else:
            app = JobRoom.following(list(args.targets), args.job_name)
    except (RunError, SlurmJobError) as exc:
        print(f"trainroom: error: {exc}", file=sys.stderr)
        return 2
    app.run()
    return app.return_code or 0
