"""`trainroom events [RUN] [--follow] [--json]`: a run's findings, state changes, actions,
attempts and alert deliveries as lines (JSON lines with --json), for scripts.

The history comes from the journal, live or not. With --follow and a live keeper the live
deltas follow it: the subscription is taken first, so nothing falls between the two, and a record
both in the journal's tail and in the first deltas is told once. When the keeper goes away the
journal's last records are read and the command ends.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.run.events import EVENT_RECORDS, Event, EventFold, to_json, to_text
from trainroom.core.run.status_text import printable
from trainroom.core.units import fmt_clock
from trainroom.core.wire import protocol as p


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("events", help="findings, state changes and actions of a run, one per line")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing as the live keeper goes on")
    sp.add_argument("--json", action="store_true", help="JSON lines")
    sp.set_defaults(func=cmd_events)


class _Printer:
    def __init__(self, run: str, as_json: bool) -> None:
        self.fold = EventFold(run)
        self.as_json = as_json

    def records(self, recs: list[p.Record]) -> None:
        for rec in recs:
            for e in self.fold.events(rec):
                self.print(e)

    def print(self, e: Event) -> None:
        line = to_json(e) if self.as_json else printable(f"{fmt_clock(e.t)}  {to_text(e)}")
        print(line, flush=True)


def _journal(run_dir: str) -> list[p.Record]:
    return list(read_journal(Path(run_dir) / runs.JOURNAL_NAME))


def _key(rec: p.Record) -> bytes | None:
    """What tells a record that can make an event from every other (its bytes); None for the rest."""
    return p.encode(rec) if isinstance(rec, EVENT_RECORDS) else None


def cmd_events(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    out = _Printer(info.run_id, args.json)
    client: KeeperClient | None = None
    if args.follow and info.alive:
        client = KeeperClient(info.sock, timeout_s=5.0)
        try:
            client.subscribe(client="events", live=True)
        except KeeperGone:
            client = None
    history = _journal(info.run_dir)
    out.records(history)
    if client is None:
        if args.follow:
            print(f"trainroom: the keeper of {info.run_id} is gone: nothing more will come", file=sys.stderr)
        return 0
    return _follow(client, info.run_dir, history, out)


def _follow(client: KeeperClient, run_dir: str, history: list[p.Record], out: _Printer) -> int:
    # The live stream starts where the snapshot was taken; the journal, read after it, may end
    # later: its event records are skipped once each when they come again live.
    overlap = Counter(k for rec in history if (k := _key(rec)) is not None)
    seen_live: Counter[bytes] = Counter()
    try:
        for batch in client.records(timeout_s=None):
            fresh = []
            for rec in batch:
                k = _key(rec)
                if k is not None and overlap[k] > 0:
                    overlap[k] -= 1
                    continue
                if k is not None:
                    seen_live[k] += 1
                fresh.append(rec)
            out.records(fresh)
    except KeeperGone:
        pass
    finally:
        client.close()
    # What the keeper journaled after its last delta reached us (its closing records).
    for rec in _journal(run_dir)[len(history) :]:
        k = _key(rec)
        if k is None:
            continue
        if seen_live[k] > 0:
            seen_live[k] -= 1
            continue
        out.records([rec])
    return 0
