"""The job screen: every node of a multi-node job at once (`trainroom job --tui`, or `trainroom
job ... --tui` with targets). One `NodeFollower` per node (a thread each: the node's live
subscription, over ssh for a remote one, "unreachable since T" with reconnects on a backoff);
the screen redraws the merged view (`core.job.view.job_dict`) twice a second: the job's state,
its first failure with host and rank, per node its state, VRAM, host memory and disk, the ranks
across hosts (median and worst step), each node's findings, and which ranks did not arrive when
a collective hangs. Read-only: the job's actions are `trainroom job --kill | --resume | --stacks`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Static

from trainroom.core.job.nodes import NodeFollower, job_name, node_refs
from trainroom.core.job.view import FAILED, STOPPED, job_dict
from trainroom.core.run.store import RunError

from . import fmt

REDRAW_S = 0.5
BAD = FAILED | STOPPED | {"unreachable"}


def _style(state: str) -> str:
    return "bold red" if state in FAILED else "bold yellow" if state in BAD else "green"


class JobRoom(App[int]):
    TITLE = "trainroom job"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "quit (the job goes on)")]
    CSS = """
    #head { height: auto; padding: 0 1; }
    DataTable { height: auto; max-height: 16; }
    #notes { height: auto; padding: 0 1; }
    """

    def __init__(self, targets: list[str], job: str | None, clock: Any = time.time) -> None:
        super().__init__()
        self.refs = node_refs(targets)
        self.job = job_name(self.refs, job)
        self.clock = clock
        self.lock = threading.Lock()
        self.followers = [NodeFollower(r, self.job, self.lock, self._changed, clock) for r in self.refs]
        self._dirty = True
        self.view: dict[str, Any] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="head")
        with VerticalScroll():
            yield DataTable(id="nodes", cursor_type="none")
            yield DataTable(id="ranks", cursor_type="none")
            yield Static(id="notes")
        yield Footer()

    def on_mount(self) -> None:
        nodes = self.query_one("#nodes", DataTable)
        nodes.add_columns("node", "state", "host", "step", "VRAM used", "host RAM free", "disk", "link / run")
        self.query_one("#ranks", DataTable).add_columns(
            "rank", "node", "host", "pid", "state", "step", "heartbeat"
        )
        for f in self.followers:
            f.start()
        self.set_interval(REDRAW_S, self._redraw)
        self._redraw()

    def on_unmount(self) -> None:
        for f in self.followers:
            f.stop()

    def _changed(self) -> None:
        self._dirty = True

    def _redraw(self) -> None:
        now = self.clock()
        with self.lock:
            d = job_dict(self.job, [f.reading for f in self.followers], now)
        self.view = d
        self._dirty = False
        self.query_one("#head", Static).update(self._head(d))
        self._fill_nodes(d)
        self._fill_ranks(d)
        self.query_one("#notes", Static).update(self._notes(d))

    def _head(self, d: dict[str, Any]) -> Text:
        steps = [r["step"] for r in d["ranks"] if r["step"] is not None]
        t = Text()
        t.append(f" job {d['job'] or '?'}  ", style="bold")
        t.append(f" {d['state'].upper()} ", style=f"reverse {_style(d['state'])}")
        t.append(f"  {len(d['nodes'])} node(s), {len(d['ranks'])} rank(s)")
        if steps:
            t.append(f"  step median {statistics.median(steps):g}, worst {min(steps)}")
        rc = d["root_cause"]
        if rc is not None:
            t.append("\nfirst failure: ", style="bold red")
            t.append(rc["message"])
        return t

    def _fill_nodes(self, d: dict[str, Any]) -> None:
        table = self.query_one("#nodes", DataTable)
        table.clear()
        for n in d["nodes"]:
            vram = n.get("vram") or {}
            host = n.get("host_mem") or {}
            disk = n.get("disk") or {}
            used = disk.get("used_fraction")
            table.add_row(
                str(n["node_rank"]) if n["node_rank"] is not None else "?",
                Text(n["state"], style=_style(n["state"])),
                n["host"] or "?",
                str(n.get("step") if n.get("step") is not None else fmt.UNKNOWN),
                fmt.nbytes(vram.get("driver_used_bytes")),
                fmt.nbytes(host.get("mem_available_bytes")),
                f"{used:.0%}" if used is not None else fmt.UNKNOWN,
                n["link"] if not n["reachable"] else f"{n['run'] or '?'}  {n['target']}",
            )

    def _fill_ranks(self, d: dict[str, Any]) -> None:
        table = self.query_one("#ranks", DataTable)
        table.clear()
        for r in d["ranks"]:
            table.add_row(
                str(r["rank"]),
                str(r["node_rank"]) if r["node_rank"] is not None else "?",
                r["host"] or "?",
                str(r["pid"] or fmt.UNKNOWN),
                Text(r["state"], style=_style(r["state"])),
                str(r["step"] if r["step"] is not None else fmt.UNKNOWN),
                f"{fmt.duration(r['heartbeat_age_s'])} ago"
                if r["heartbeat_age_s"] is not None
                else fmt.UNKNOWN,
            )

    def _notes(self, d: dict[str, Any]) -> Text:
        t = Text()
        if d["hang"] is not None:
            t.append("hang: ", style="bold yellow")
            t.append(d["hang"]["summary"] + "\n")
        for f in d["findings"]:
            t.append(
                f"{f['severity'][:4].upper()} {f['code']} ",
                style=_style("dead" if f["severity"] == "critical" else "hung"),
            )
            t.append(f"node {f['node_rank']} ({f['host']}): {f['message']}\n")
        if not t:
            t.append("no findings on any node", style="dim")
        return t


def run_job_app(args: argparse.Namespace) -> int:
    """`trainroom job [TARGET ...] --tui`: bad input is one line on stderr and exit 2."""
    if not sys.stdout.isatty():
        print("trainroom: the job screen needs a terminal (try `trainroom job --json`)", file=sys.stderr)
        return 2
    try:
        app = JobRoom(list(args.targets), args.job_name)
    except RunError as exc:
        print(f"trainroom: error: {exc}", file=sys.stderr)
        return 2
    app.run()
    return app.return_code or 0
