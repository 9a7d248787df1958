"""Stand-ins at the control room's one boundary (the keeper link and the run source), and a
RunState built the way a client really gets one: by applying keeper records.

Everything above the boundary in the TUI tests is the real app; these fakes only replace the
socket. They record every request, so a test can assert what the keeper was asked.
"""

from __future__ import annotations

import asyncio
import functools
import io
import math
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from rich.console import Console

from trainroom.core.findings import Finding
from trainroom.core.run.state import RunState, from_snapshot, to_snapshot
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.core.run.view import RunView
from trainroom.core.samples import DiskSample, GpuDevice, GpuProcess, GpuSample, HostSample
from trainroom.core.wire import protocol as p

T0 = 1_700_000_000.0  # the frozen clock's epoch
GiB = 1 << 30
MiB = 1 << 20


class KeeperGoneForTest(Exception):
    pass


def rx(attempt: int, rank: int, t: float, msg: Any) -> p.Received:
    return p.Received(attempt=attempt, rank=rank, t=t, msg=msg)


def healthy_records(
    *,
    steps: int = 40,
    ranks: int = 1,
    vocab: int = 50257,
    lr: float = 1e-4,
    effective_lr: float | None = None,
    t0: float = T0,
) -> list[Any]:
    """A running attempt: Hello, steps every 0.5 s with tokens and a decaying loss, a probe."""
    recs: list[Any] = [
        p.AttemptStarted(
            n=1,
            t=t0,
            pid=4242,
            pgid=4242,
            start_time=t0,
            argv=["python", "train.py", "--lr", "1e-4"],
            cwd="/work",
            requested=p.RequestedConfig(lr=lr, vocab_size=vocab),
        ),
        p.RunStatus(t=t0, state="starting"),
    ]
    recs += [
        rx(
            1,
            r,
            t0 + 0.1,
            p.Hello(
                pid=4242 + r, rank=r, world_size=ranks, config=p.RequestedConfig(lr=lr, vocab_size=vocab)
            ),
        )
        for r in range(ranks)
    ]
    for i in range(steps):
        t = t0 + 1 + i * 0.5
        for r in range(ranks):
            loss = 10.9 * math.exp(-i / 30) + 2.0
            recs.append(
                rx(
                    1,
                    r,
                    t,
                    p.Step(
                        step=i,
                        t=t,
                        tokens=(i + 1) * 8192,
                        loss=loss,
                        grad_norm=1.5,
                        lr=[effective_lr if effective_lr is not None else lr],
                        alloc_allocated=5 * GiB,
                        alloc_reserved=6 * GiB,
                        alloc_peak=7 * GiB,
                    ),
                )
            )
    recs.append(p.RunStatus(t=t0 + 2, state="running"))
    recs.append(
        p.ProbeSample(
            t=t0 + steps * 0.5,
            gpu=GpuSample(
                t=t0 + steps * 0.5,
                available=True,
                per_process=True,
                devices=[
                    GpuDevice(
                        index=0,
                        name="RTX 3060",
                        used_bytes=11 * GiB + 200 * MiB,
                        total_bytes=12 * GiB,
                        util_percent=97,
                        power_w=151.0,
                    )
                ],
                processes=[GpuProcess(pid=4242, used_bytes=11 * GiB, exists=True, ours=True)],
            ),
            host=HostSample(
                t=t0 + steps * 0.5,
                available=True,
                mem_available_bytes=2 * GiB + 100 * MiB,
                mem_total_bytes=31 * GiB,
                page_cache_bytes=6 * GiB,
            ),
            disk=DiskSample(path="/ckpt", used_fraction=0.94, total_bytes=1000 * GiB, free_bytes=60 * GiB),
        )
    )
    return recs


def build_state(records: list[Any], run_id: str = "20250101-120000-train-ab12") -> RunState:
    st = RunState(run_id=run_id, argv=["python", "train.py"], cwd="/work", created=T0)
    for r in records:
        st.apply(r)
    return st


def dead_run_records() -> list[Any]:
    """Scenario 1: SIGKILL at step 322 with the last verified checkpoint at 300."""
    recs = healthy_records(steps=10)
    t = T0 + 200
    for step in range(300, 323):
        recs.append(
            rx(
                1,
                0,
                t,
                p.Step(
                    step=step,
                    t=t,
                    tokens=(step + 1) * 8192,
                    loss=2.31,
                    lr=[1e-4],
                    alloc_allocated=5 * GiB,
                    alloc_reserved=6 * GiB,
                    alloc_peak=7 * GiB,
                ),
            )
        )
        t += 0.5
        if step == 300:
            recs.append(
                p.CheckpointState(
                    path="/ckpt/step-000300", step=300, state="verified", t=t, size_bytes=int(3.9 * GiB)
                )
            )
    recs.append(
        p.CheckpointState(
            path="/ckpt/.quarantine/step-000322",
            step=322,
            state="rejected",
            t=t,
            reason="truncated",
            size_bytes=1 * GiB,
        )
    )
    recs.append(p.AttemptEnded(n=1, t=t + 0.2, exit_signal=9))
    recs.append(p.RunStatus(t=t + 0.3, state="dead", reason="killed by SIGKILL at step 322"))
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="DEAD",
                severity="critical",
                action="resume",
                first_seen=t + 0.3,
                last_seen=t + 0.3,
                message="trainer killed by SIGKILL at step 322; 22 steps lost since step 300",
                evidence={"signal": 9, "last_step": 322, "steps_lost": 22},
            )
        )
    )
    recs.append(
        p.FindingRaised(
            finding=Finding(
                code="HOST_RAM_LOW",
                severity="warning",
                action="reclaim",
                first_seen=t,
                last_seen=t,
                message="2.1 GiB available < 3.0 GiB",
                evidence={"mem_available_bytes": 2 * GiB},
            )
        )
    )
    return recs


Replier = Callable[[str, dict[str, Any], bool], list[p.Reply]]


def default_replier(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
    if not confirm:
        # The keeper's plans in their real shapes (what each action's own words are made of).
        plans = {
            "kill": {
                "pgid": 4242,
                "leader_pid": 4242,
                "members": [
                    {"pid": 4242, "ppid": 1, "pgid": 4242, "state": "R", "cmdline": ["python", "train.py"]},
                    {
                        "pid": 4250,
                        "ppid": 4242,
                        "pgid": 4242,
                        "state": "S",
                        "cmdline": ["python", "-c", "worker"],
                    },
                ],
                "strangers": [],
                "refusals": [],
                "empty": False,
                "label": "",
                "ok": True,
                "nothing_left": False,
                "grace_s": 10.0,
                "vram_timeout_s": 50.0,
                "step": 130,
                "last_verified_step": 100,
            },
            "prune": {
                "root": "/ckpt",
                "keep": 1,
                "bytes_to_free": 4 * GiB,
                "delete": [{"step": 100, "path": "/ckpt/step-000100", "bytes": 4 * GiB, "kind": "verified"}],
                "kept": [{"step": 200, "path": "/ckpt/step-000200", "why": "one of the last 1 verified"}],
                "skipped": [],
            },
            "reclaim": {
                "method": "cgroup2-memory.reclaim",
                "target": "/sys/fs/cgroup/user.slice/memory.reclaim",
                "value": "6442450944",
                "cgroup": "/user.slice",
                "bytes_requested": 6 * GiB,
                "page_cache_bytes": 6 * GiB,
                "passed_over": [],
            },
            "resume": {
                "ok": True,
                "attempt": 2,
                "checkpoint": "/ckpt/step-000300",
                "step": 300,
                "argv": ["python", "train.py", "--resume", "/ckpt/step-000300"],
                "templated": True,
                "template_from": "trainroom.toml",
                "died_at_step": 322,
                "steps_lost": 22,
                "checkpoint_bytes": int(3.9 * GiB),
                "mem_available_bytes": 2 * GiB,
            },
        }
        return [p.Reply(id=1, action=action, stage="plan", plan=plans.get(action, {"device": "cpu"}))]
    return [
        p.Reply(id=2, action=action, stage="progress", message="SIGTERM sent to pgid 4242"),
        p.Reply(
            id=2,
            action=action,
            stage="done",
            ok=True,
            message=f"{action} done",
            before={"vram_used_bytes": 12 * GiB, "members": 2},
            after={"vram_used_bytes": 400 * MiB, "members": 0},
        ),
    ]


class FakeLink:
    """A keeper link without a socket: `push` delivers a batch, `go_away` ends it."""

    def __init__(self, snapshot: RunState, replier: Replier = default_replier) -> None:
        self._snapshot = snapshot
        self._queue: queue.Queue[Any] = queue.Queue()
        self.replier = replier
        self.requests: list[tuple[str, dict[str, Any], bool]] = []
        self.subscribed = threading.Event()
        self.closed = False

    def subscribe_view(self, client: str = "tui") -> RunView:
        # Through builtins, as the wire does: the app never shares the test's object.
        state = from_snapshot(msgspec.msgpack.decode(msgspec.msgpack.encode(to_snapshot(self._snapshot))))
        self.subscribed.set()
        return RunView(state)

    def records(self) -> Iterator[list[Any]]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def push(self, records: list[Any]) -> None:
        self._queue.put(records)

    def go_away(self, reason: str = "keeper gone: connection reset") -> None:
        self._queue.put(KeeperGoneForTest(reason))

    def request(self, action: str, args: dict[str, Any], confirm: bool) -> Iterator[p.Reply]:
        self.requests.append((action, args, confirm))
        yield from self.replier(action, args, confirm)

    def close(self) -> None:
        self.closed = True
        self._queue.put(None)


class FakeRuns:
    """A run source over fixed runs; `journal` is the state `load_state` replays."""

    def __init__(
        self,
        runs: list[RunInfo],
        links: dict[str, FakeLink] | None = None,
        journal: dict[str, RunState] | None = None,
        summaries: dict[str, RunSummary] | None = None,
    ) -> None:
        self.runs = runs
        self.links = links or {}
        self.journal = journal or {}
        self.summaries = summaries or {}
        self.connects: list[str] = []
        self.peeks: list[str] = []

    def list_runs(self) -> list[RunInfo]:
        return list(self.runs)

    def resolve(self, spec: str | None) -> RunInfo:
        for r in self.runs:
            if r.run_id == spec:
                return r
        raise RunError(f"unknown run {spec!r}")

    def connect(self, run: RunInfo) -> FakeLink:
        self.connects.append(run.run_id)
        if run.run_id not in self.links:
            raise ConnectionRefusedError(f"no keeper on {run.sock}")
        return self.links[run.run_id]

    def load_view(self, run: RunInfo) -> RunView:
        return RunView(self.journal[run.run_id])

    def peek(self, run: RunInfo) -> RunState:
        self.peeks.append(run.run_id)
        if run.run_id not in self.links:
            raise ConnectionRefusedError(f"no keeper on {run.sock}")
        return self.links[run.run_id].subscribe_view().state

    def summary(self, run: RunInfo) -> RunSummary | None:
        return self.summaries.get(run.run_id)


def run_info(run_id: str, run_dir: str, alive: bool = True, created: float = T0) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        run_dir=run_dir,
        sock=f"{run_dir}/keeper.sock",
        created=created,
        argv=["python", "train.py"],
        alive=alive,
    )


def screen_text(app: Any) -> str:
    """The screen as plain text, from the compositor (what a terminal shows, minus colour)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


# --------------------------------------------------------------------------- driving the app


async def until(pilot: Any, cond: Callable[[], bool], what: str = "condition", tries: int = 500) -> None:
    """Let the app run until `cond` holds (a bounded wait on an event, not a timing assertion)."""
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"never happened: {what}")


def shipped_themes() -> list[Any]:
    from importlib import resources

    return [resources.files("trainroom.themes")]


def write_log(run_dir: str, lines: int = 30) -> None:
    with open(os.path.join(run_dir, "trainer.log"), "w") as f:
        for i in range(lines):
            f.write(f"iter {i}: loss {2.5 - i / 100:.4f}, time 12.34ms\n")
        f.write("last line of the log\n")


def make_app(
    run_dir: str,
    records: list[Any],
    *,
    alive: bool = True,
    replier: Replier = default_replier,
    now: float = T0 + 215,
    journal: RunState | None = None,
    theme: str | None = None,
    theme_dirs: list[Any] | None = None,
    **kw: Any,
) -> tuple[Any, FakeLink, FakeRuns]:
    from trainroom.tui.app import ControlRoom

    st = build_state(records)
    write_log(run_dir)
    info = run_info(st.run_id, run_dir, alive=alive)
    link = FakeLink(st, replier)
    runs = FakeRuns([info], {info.run_id: link} if alive else {}, journal={info.run_id: journal or st})
    app = ControlRoom(
        info.run_id,
        theme,
        source=runs,
        clock=lambda: now,
        theme_dirs=theme_dirs if theme_dirs is not None else shipped_themes(),
        **kw,
    )
    return app, link, runs


async def settle(app: Any, pilot: Any) -> None:
    """Wait for the snapshot (or the journal) and the log tail, then render once."""
    await until(pilot, lambda: app.state is not None and app.log_lines != (), "the first state and log")
    app.redraw()
    await pilot.pause()


def in_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run an async test in a fresh event loop (no pytest-asyncio here; `wraps` keeps the
    signature, so pytest still injects fixtures such as tmp_path)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
