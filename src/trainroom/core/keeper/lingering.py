"""A cap on keepers lingering after their trainer died: each dead run's keeper waits
`[keeper] dead_linger_s` (an hour) for its resume, and twenty dead runs would keep twenty keepers.
A dead keeper that is idle leaves a marker in its run dir (its pid, start, and since when it has
lingered); when more live keepers linger dead than `[keeper] max_dead_lingerers`, the oldest
lingerers leave first, each saying why in its journal. A marker whose keeper is gone is ignored
(and removed by whoever sees it)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from trainroom.core.probes import procs

MARKER = ".dead-lingering"
SCAN_MAX = 10_000  # run dirs looked at, at most


def _alive(pid: int, ticks: int | None) -> bool:
    got = procs.start_ticks(pid)
    return got is not None and (ticks is None or got == ticks)


class DeadLingerers:
    def __init__(self, run_dir: Path, cap: int) -> None:
        self.run_dir = run_dir
        self.cap = cap
        self.marker = run_dir / MARKER
        self._ticks = procs.start_ticks(os.getpid())
        self._marked: float | None = None

    def leave(self) -> None:
        """No longer lingering dead (woken, resumed, or exiting)."""
        if self._marked is not None:
            with contextlib.suppress(OSError):
                self.marker.unlink()
            self._marked = None

    def over_cap(self, since: float, now: float) -> str | None:
        """This keeper lingers dead since `since`: why it must leave now (it is among the oldest
        past the cap), or None."""
        if self._marked != since:
            tmp = self.marker.with_name(f"{MARKER}.{os.getpid()}.tmp")
            with contextlib.suppress(OSError):
                tmp.write_text(json.dumps({"pid": os.getpid(), "ticks": self._ticks, "since": since}))
                os.replace(tmp, self.marker)
                self._marked = since
        others: list[tuple[float, str]] = []
        try:
            dirs = os.scandir(self.run_dir.parent)
        except OSError:
            return None
        with dirs:
            for n, e in enumerate(dirs):
                if n >= SCAN_MAX:
                    break
                if e.name == self.run_dir.name:
                    continue
                m = Path(e.path) / MARKER
                try:
                    d = json.loads(m.read_text())
                    pid, ticks, t = int(d["pid"]), d.get("ticks"), float(d["since"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if _alive(pid, ticks if isinstance(ticks, int) else None):
                    others.append((t, e.name))
                else:
                    with contextlib.suppress(OSError):
                        m.unlink()
        lingering = sorted([*others, (since, self.run_dir.name)])
        if len(lingering) <= self.cap:
            return None
        leaving = lingering[: len(lingering) - self.cap]
        if (since, self.run_dir.name) not in leaving:
            return None
        self.leave()
        return (
            f"keeper exits: {len(lingering)} dead runs' keepers linger, more than [keeper] "
            f"max_dead_lingerers = {self.cap}; the oldest leave first (this one idle for {now - since:.0f} s); "
            "`trainroom status` still reads the run from its journal, and `trainroom resume` starts a keeper again"
        )
