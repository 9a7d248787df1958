"""The job screen on a Slurm job (`trainroom job slurm:JOBID --tui`): Slurm's state, time left,
restarts and a requeued job's eligibility countdown in the header, each node's Slurm state beside
its keepers, and the verdicts (DEAD naming rank/node/pid, NODE_LOST) as `--json` words them.

No cluster here (tests/e2e/test_slurm.py owns the real one): stand-in `scontrol` and `srun` on
PATH, as scripts/bench_slurm_job.py uses, answer with recorded 22.05 lines and what `trainroom
bridge --all --lines` prints (real run states folded from records); the rest — the reader and its
cache, the srun step, the slurmd probe, the merge — is the real core path."""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.tui_fakes import (
    T0,
    build_state,
    dead_run_records,
    healthy_records,
    in_loop,
    screen_text,
    until,
)
from trainroom.core.cli import main as cli
from trainroom.core.cli.slurmjob import slurm_job_dict
from trainroom.core.configuration.settings import JobOptions, LaunchOptions
from trainroom.core.job.slurm import SlurmJobError
from trainroom.core.job.slurmwatch import SlurmWatch
from trainroom.core.remote.wire import BridgeHello
from trainroom.core.run.state import RunState
from trainroom.core.slurm.scontrol import SlurmReader
from trainroom.core.wire import protocol as p
from trainroom.tui.job import JobRoom, NodesPanel
from trainroom.tui.jobview import job_screen_view

JOB = "4242"
NOW = T0 + 215
SIZES = [(80, 24), (160, 48)]


def _state(records: list[Any], node: str, rank: int) -> RunState:
    st = build_state(records, run_id=f"run-{node}")
    st.options = LaunchOptions(
        job=JobOptions(name=f"slurm-{JOB}", source="SLURM_JOB_ID", host=node, node_rank=rank, nnodes="2")
    )
    return st


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on return: nothing listens there


class Cluster:
    """scontrol and srun stand-ins; each call is one line in calls.log."""

    def __init__(self, d: Path) -> None:
        self.d = d
        (d / "bin").mkdir()
        self.calls = d / "calls.log"
        self.calls.touch()
        (d / "bin" / "scontrol").write_text(
            f'#!/bin/sh\necho "scontrol $2" >> {self.calls}\n'
            f'case "$2" in job) cat {d / "job.txt"};; node) cat {d / "nodes.txt"};; esac\n'
        )
        (d / "bin" / "srun").write_text(f"#!/bin/sh\necho srun >> {self.calls}\ncat {d / 'all.txt'}\n")
        for f in (d / "bin").iterdir():
            f.chmod(0o755)
        self.answer({}, "JobState=RUNNING", nodes="")

    def answer(self, runs: dict[str, RunState], job: str, nodes: str) -> None:
        lines = []
        for i, (node, st) in enumerate(runs.items()):
            hello = BridgeHello(host=node, run_id=st.run_id, keeper="alive", job=f"slurm-{JOB}", node_rank=i)
            snap = p.Snapshot(v=p.PROTOCOL_VERSION, state=msgspec.to_builtins(st))
            lines += [
                f"{i}: TRB {base64.b64encode(p.frame(m)[p.HEADER.size :]).decode()}" for m in (hello, snap)
            ]
        (self.d / "all.txt").write_text("".join(f"{x}\n" for x in lines))
        (self.d / "job.txt").write_text(
            f"JobId={JOB} JobName=train UserId=me(1000) {job} Requeue=1 ExitCode=0:0 "
            "DerivedExitCode=0:0 BatchHost=n1 NumNodes=2 Command=/home/me/job.sh WorkDir=/home/me\n"
        )
        (self.d / "nodes.txt").write_text(nodes)

    def said(self) -> list[str]:
        return self.calls.read_text().splitlines()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    yield c


RUNNING = "JobState=RUNNING Reason=None Restarts=0 RunTime=00:20:00 TimeLimit=01:00:00 NodeList=n[1-2]"


def rank_died(c: Cluster) -> None:
    """n1 trains on; rank 1's trainer on n2 was SIGKILLed; Slurm says RUNNING, both ALLOCATED."""
    c.answer(
        {"n1": _state(healthy_records(), "n1", 0), "n2": _state(dead_run_records(), "n2", 1)},
        RUNNING,
        "NodeName=n1 State=ALLOCATED Reason=\nNodeName=n2 State=ALLOCATED Reason=\n",
    )


def node_lost(c: Cluster) -> None:
    """n2's slurmd answers nothing (its port is closed) while slurmctld still says ALLOCATED; a
    third view: slurmctld has already drained n1 (DRAIN, with its reason)."""
    c.answer(
        {"n1": _state(healthy_records(), "n1", 0)},
        RUNNING,
        "NodeName=n1 State=MIXED+DRAIN Reason=disk check failed [root@2026-12-06T06:00:00]\n"
        f"NodeName=n2 NodeAddr=127.0.0.1 Port={_closed_port()} State=ALLOCATED Reason=\n",
    )


def _watch(c: Cluster) -> SlurmWatch:
    w = SlurmWatch(JOB, SlurmReader())
    w.refresh()
    return w


@pytest.mark.parametrize("size", SIZES)
@in_loop
async def test_a_dead_rank_shows_beside_slurms_running_state_time_left_and_node_states(
    cluster: Cluster, size: tuple[int, int]
) -> None:
    rank_died(cluster)
    want = slurm_job_dict(JOB, SlurmReader(), now=NOW)  # what `--json` says of the same job
    watch = _watch(cluster)
    app = JobRoom.following_slurm(watch, clock=lambda: NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.view is not None, "the first view")
        await pilot.pause()
        text = screen_text(app)
        lines = text.splitlines()
        assert lines[0].startswith(" job slurm-4242") and " DEAD " in lines[0]
        assert "slurm 4242 RUNNING · restarts 0 · 40m00s left of 1h00m" in lines[1]
        # The root cause as `--json` words it: rank, node (host) and pid.
        rc = want["root_cause"]
        assert rc is not None and rc["host"] == "n2"
        assert lines[2].startswith(" first failure: " + str(rc["message"])[: size[0] - 20])
        assert "Slurm" in text and text.count("ALLOCATED") == 2
        assert app.view is not None
        rows = {n.host: n for n in app.view.nodes}
        assert (rows["n1"].state, rows["n1"].slurm, rows["n1"].slurm_level) == ("running", "ALLOCATED", "ok")
        assert (rows["n2"].state, rows["n2"].slurm) == ("dead", "ALLOCATED")
        # Every finding fits, wrapped (the findings panel is sized to its wrapped lines).
        assert app.view.notes and all(n.label in text for n in app.view.notes)
        assert "q quit" in lines[-1]
        await pilot.press("q")


@pytest.mark.parametrize("size", SIZES)
@in_loop
async def test_a_lost_node_is_named_first_and_a_drained_node_shows_slurms_reason(
    cluster: Cluster, size: tuple[int, int]
) -> None:
    node_lost(cluster)
    want = slurm_job_dict(JOB, SlurmReader(), now=NOW)["slurm"]["verdicts"]
    watch = _watch(cluster)
    app = JobRoom.following_slurm(watch, clock=lambda: NOW)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.view is not None, "the first view")
        await pilot.pause()
        v = app.view
        assert v is not None
        lost = [x for x in want if x["code"] == "NODE_LOST"]
        assert [x["node"] for x in lost] == ["n2", "n1"] or [x["node"] for x in lost] == ["n1", "n2"]
        # The findings panel: the lost nodes first, in --json's words and at crit.
        assert [(n.label, n.text) for n in v.notes[:2]] == [("CRIT NODE_LOST", x["message"]) for x in lost]
        assert "slurmd at 127.0.0.1" in v.notes[0].text + v.notes[1].text
        rows = {n.host: n for n in v.nodes}
        assert rows["n1"].slurm == "MIXED+DRAIN: disk check failed [root@2026-12-06T06:00:00]"
        assert rows["n1"].slurm_level == "crit" and rows["n2"].slurm == "ALLOCATED"
        assert rows["n2"].state == "unreachable" and rows["n2"].level == "warn"
        text = screen_text(app)
        assert "CRIT NODE_LOST" in text and "MIXED+DRAIN" in text
        crit = app.query_one(NodesPanel).style("crit")
        assert crit.color is not None
        await pilot.press("q")


@in_loop
async def test_a_requeued_job_counts_down_to_eligibility_and_slurm_is_asked_once_per_interval(
    cluster: Cluster,
) -> None:
    eligible = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(NOW + 100))
    cluster.answer(
        {},
        f"JobState=PENDING Reason=BeginTime Restarts=1 RunTime=00:00:00 TimeLimit=01:00:00 "
        f"NodeList=(null) EligibleTime={eligible}",
        "",
    )
    clock = [NOW]
    began = time.monotonic()
    watch = _watch(cluster)
    assert watch.interval_s == 3.0 and SlurmWatch(JOB, interval_s=0.1).interval_s == 3.0
    app = JobRoom.following_slurm(watch, clock=lambda: clock[0])
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.view is not None, "the first view")
        head = app.view.head.slurm if app.view is not None else None
        assert head is not None and head.state == "PENDING" and head.reason == "BeginTime"
        assert head.eligible_in == "1m40s" and head.restarts == "1" and head.level == "info"
        line = screen_text(app).splitlines()[1]
        assert line.startswith(" slurm 4242 PENDING (BeginTime) · eligible to start in 1m40s")
        clock[0] += 30  # the countdown moves between Slurm's answers: core's view against the clock
        await until(
            pilot,
            lambda: (
                app.view is not None
                and app.view.head.slurm is not None
                and app.view.head.slurm.eligible_in == "1m10s"
            ),
            "the countdown",
        )
        # Several redraws (one every 0.5 s) a watch interval: one Slurm query per 3 s however many
        # (a loaded machine may take more than one interval to get here: counted, not assumed).
        await until(pilot, lambda: len(app.screen.children) > 0, "mounted")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.2:
            await pilot.pause(0.2)
        said = cluster.said()
        intervals = int((time.monotonic() - began) / watch.interval_s)
        assert set(said) == {"scontrol job"}, said  # no node list: no node query, no srun
        assert 1 <= len(said) <= 1 + intervals, (said, intervals)
        await pilot.press("q")


def test_the_view_without_slurm_keeps_the_plain_columns(cluster: Cluster) -> None:
    rank_died(cluster)
    d = slurm_job_dict(JOB, SlurmReader(), now=NOW)
    assert job_screen_view(d).node_columns[3] == "Slurm"
    del d["slurm"]
    v = job_screen_view(d)
    assert "Slurm" not in v.node_columns and all(n.slurm is None for n in v.nodes)


def test_job_slurm_tui_opens_the_job_screen_on_the_slurm_job(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []

    def open_tui(args: Any) -> int:
        opened.append(args)
        return 0

    monkeypatch.setattr(cli, "_open_tui", open_tui)  # the console script's hook, for this test only
    assert cli.main(["job", f"slurm:{JOB}", "--tui"]) == 0
    assert opened and opened[0].slurm_job_id == JOB and opened[0].cmd == "job"
    assert cli.main(["job", f"slurm:{JOB}", "--tui", "--json"]) == 2
    assert "choose one" in capsys.readouterr().err
    assert cluster.said() == []  # the CLI leaves the reading to the screen


@in_loop
async def test_a_failed_refresh_keeps_the_last_answer_and_says_why(cluster: Cluster) -> None:
    rank_died(cluster)
    real = _watch(cluster).job
    answers: list[Any] = [real]

    def read(job_id: str, reader: SlurmReader) -> Any:
        if answers:
            return answers.pop(0)
        raise SlurmJobError("slurm:4242: slurmctld does not know the job")

    watch = SlurmWatch(JOB, SlurmReader(min_interval_s=0.05), interval_s=0.05, read=read)
    watch.refresh()
    app = JobRoom.following_slurm(watch, clock=lambda: NOW)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(
            pilot,
            lambda: (
                app.view is not None
                and app.view.head.slurm is not None
                and app.view.head.slurm.note is not None
            ),
            "the failed refresh said",
        )
        assert app.view is not None and app.view.head.slurm is not None
        assert app.view.head.slurm.state == "RUNNING" and len(app.view.nodes) == 2  # the last answer
        assert str(app.view.head.slurm.note).startswith(
            "last refresh failed: slurm:4242: slurmctld does not know"
        )
        assert "last refresh failed" in screen_text(app).splitlines()[1]
        await pilot.press("q")


def test_run_job_app_refuses_a_job_it_cannot_show_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse
    import sys

    from trainroom.tui.job import run_job_app

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    args = argparse.Namespace(targets=[], job_name=None, slurm_job_id="12;rm")
    assert run_job_app(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trainroom: error: slurm:12;rm: expected a job id (digits, or ARRAYJOB_TASK)"]
