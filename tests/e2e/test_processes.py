"""The processes table (nvitop's) under a real `demo --ranks 2` (torchrun, two CPU ranks): every
rank's pid with its CPU %, RSS and command, as the keeper's probe reads them; a signal chosen for
one process reaches that process only, proven by its pid and start tick, and is journaled.

Every process signalled here is one this test started (the rank pids come from the run's own
table, checked to be under this run's leader); the `trhome` fixture tears down the rest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

from tests.support.helpers import run_cli, start_demo
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.procs import read_stat
from trainroom.core.run import store as runs
from trainroom.core.run.client import current_state
from trainroom.core.samples import ProcRow
from trainroom.core.wire import protocol as p

START_S = 240.0  # two ranks importing torch on a loaded 2-core machine


def _table(info: runs.RunInfo) -> list[ProcRow]:
    st, _ = current_state(runs.resolve_run(info.run_id))
    procs = st.probe.procs if st.probe is not None else None
    return list(procs.table) if procs is not None else []


def _ranks_measured(info: runs.RunInfo) -> list[ProcRow] | None:
    rows = _table(info)
    ranks = [r for r in rows if r.role == "rank"]
    if sorted(r.rank for r in ranks) != [0, 1]:
        return None
    if any(r.cpu_percent is None or not r.rss_bytes or not r.cmdline for r in ranks):
        return None
    return rows


def _letter(pid: int) -> str | None:
    st = read_stat(pid)
    return st.state if st is not None else None


def _signal(info: runs.RunInfo, row: ProcRow, sig: str) -> dict[str, Any]:
    args = ("--pid", str(row.pid), "--signal", sig, "--yes", "--json")
    done = run_cli("kill", info.run_id, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_the_table_lists_every_rank_and_a_signal_reaches_only_its_process(trhome: Path) -> None:
    info = start_demo(ranks=2, step_delay=0.05)
    rows = wait_for(lambda: _ranks_measured(info), timeout=START_S, what="both ranks in the table, measured")
    agent = rows[0]
    assert agent.role == "agent" and agent.rank is None
    assert any("torch" in a for a in agent.cmdline), agent.cmdline  # torchrun (torch.distributed.run)
    ranks = {r.rank: r for r in rows if r.role == "rank"}
    leader = psutil.Process(agent.pid)
    under = {c.pid for c in leader.children(recursive=True)}
    for r in ranks.values():
        assert r.pid in under and r.ppid == agent.pid  # the tree: agent -> workers
        assert r.state in "RSD" and r.elapsed_s > 0 and r.start_ticks == read_stat(r.pid).start_ticks  # type: ignore[union-attr]
        assert "trainroom.core.demo.train" in r.cmdline, r.cmdline  # the demo runs its trainer with -m

    target, other = ranks[1], ranks[0]
    stopped = _signal(info, target, "STOP")
    assert stopped["ok"], stopped
    assert _letter(target.pid) == "T"
    assert _letter(other.pid) != "T" and _letter(agent.pid) != "T"
    assert "SIGSTOP" in stopped["message"] and "stopped" in stopped["message"]

    resumed = _signal(info, target, "CONT")
    assert resumed["ok"], resumed
    assert _letter(target.pid) not in ("T", None)

    # Not the run's: refused, nothing sent (this test's own process, under another tree).
    refused = run_cli("kill", info.run_id, "--pid", str(os.getpid()), "--signal", "STOP", "--yes", "--json")
    assert refused.returncode != 0
    assert (
        "not proven this run's" in refused.stdout + refused.stderr
        or "refusing" in refused.stdout + refused.stderr
    )
    assert _letter(os.getpid()) != "T"

    def journaled() -> list[p.ActionRecord] | None:
        recs = [
            r
            for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
            if isinstance(r, p.ActionRecord) and r.action == "kill" and r.target.get("signal")
        ]
        return recs if len(recs) >= 2 else None

    recs = wait_for(journaled, timeout=30, what="both signals journaled")
    assert [r.target["signal"] for r in recs[:2]] == ["STOP", "CONT"]
    assert all(r.target["members"][0]["pid"] == target.pid for r in recs[:2])
