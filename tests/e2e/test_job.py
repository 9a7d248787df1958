"""A two-node torchrun job (gloo, c10d on 127.0.0.1) under two keepers, node 1 reached only
through ssh:// (a real sshd on 127.0.0.1): the job's death, hang, dropped link and kill as node 0
sees them."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.job_nodes import TwoNodes, sshd, start_two_nodes
from tests.support.sshd import Sshd
from tests.support.waiting import wait_for

__all__ = ["sshd"]  # the module-scoped sshd fixture, imported for pytest


@pytest.fixture
def nodes(trhome: Path, sshd: Sshd) -> Iterator[TwoNodes]:
    yield from start_two_nodes(trhome, sshd)


def test_sigkill_of_the_rank_on_node_1_is_the_jobs_root_cause_seen_from_node_0(nodes: TwoNodes) -> None:
    d = nodes.job_json()
    assert d["job"] == nodes.job and [n["node_rank"] for n in d["nodes"]] == [0, 1]
    victim = nodes.rank(d, 1)
    assert victim is not None and victim["node_rank"] == 1 and victim["pid"]
    os.kill(victim["pid"], signal.SIGKILL)

    def dead() -> dict | None:
        j = nodes.job_json()
        return j if j["state"] == "dead" and j["root_cause"] is not None else None

    j = wait_for(dead, timeout=90, interval=0.5, what="the job dead with a root cause")
    rc = j["root_cause"]
    assert (rc["rank"], rc["node_rank"], rc["node"]) == (1, 1, nodes.remote), rc
    assert rc["t"] <= min(r["disconnected_at"] or rc["t"] for r in j["ranks"])
    assert "rank 1 on node 1" in rc["message"]


@pytest.fixture
def bare_nodes(trhome: Path, sshd: Sshd) -> Iterator[TwoNodes]:
    yield from start_two_nodes(trhome, sshd, "--bare")


def test_uninstrumented_sigkill_of_rank_1_on_node_1_names_it_with_no_phantom_rank_0(
    bare_nodes: TwoNodes,
) -> None:
    nodes = bare_nodes
    d = nodes.job_json()
    # Node 1's only worker is rank 1 (its environment says so): its log lines are rank 1's.
    assert sorted((r["rank"], r["node_rank"]) for r in d["ranks"]) == [(0, 0), (1, 1)], d["ranks"]
    victim = nodes.rank(d, 1)
    assert victim is not None and victim["pid"]
    os.kill(victim["pid"], signal.SIGKILL)

    def dead() -> dict | None:
        j = nodes.job_json()
        return j if j["state"] == "dead" and j["root_cause"] is not None else None

    j = wait_for(dead, timeout=90, interval=0.5, what="the job dead with a root cause")
    rc = j["root_cause"]
    assert (rc["rank"], rc["node_rank"], rc["signal"]) == (1, 1, signal.SIGKILL), rc
    assert "rank 1 on node 1" in rc["message"] and "killed by SIGKILL" in rc["message"], rc["message"]
    assert not [r for r in j["ranks"] if r["rank"] == 0 and r["node_rank"] == 1], j["ranks"]


def test_sigstop_of_a_rank_the_job_names_it_hung(nodes: TwoNodes) -> None:
    victim = nodes.rank(nodes.job_json(), 1)
    assert victim is not None
    proc = psutil.Process(victim["pid"])
    proc.suspend()
    try:

        def hung() -> dict | None:
            j = nodes.job_json()
            return j if j["state"] == "hung" and j["hang"] and j["hang"]["not_arrived"] else None

        j = wait_for(
            hung, timeout=120, interval=1.0, what="the job hung, naming the rank that did not arrive"
        )
        assert [m["rank"] for m in j["hang"]["not_arrived"]] == [1], j["hang"]
        assert j["hang"]["not_arrived"][0]["node_rank"] == 1
        # Every rank's stacks through its node's keeper: rank 1 (stopped) read by py-spy.
        out = nodes.cli("job", nodes.run0, nodes.remote, "--stacks", "--json", timeout=180)
        assert out.returncode in (0, 1), out.stderr
    finally:
        proc.resume()


def test_a_dropped_ssh_link_is_unreachable_then_recovered_never_dead(
    nodes: TwoNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainroom.core.job.nodes import NodeFollower, node_refs
    from trainroom.core.job.view import job_dict

    for k in ("TRAINROOM_SSH_COMMAND", "TRAINROOM_REMOTE_COMMAND"):
        monkeypatch.setenv(k, nodes.env[k])
    lock = threading.Lock()
    seen: list[str] = []  # every change of the node's state, as the follower reported it
    ref = node_refs([nodes.remote], hosts={})[0]
    follower: NodeFollower

    def changed() -> None:
        with lock:
            state = job_dict(nodes.job, [follower.reading], time.time())["nodes"][0]["state"]
        if not seen or seen[-1] != state:
            seen.append(state)

    follower = NodeFollower(ref, nodes.job, threading.Lock(), changed)
    follower.lock = lock
    follower.start()
    try:
        wait_for(lambda: seen and seen[-1] == "running", timeout=60, what="the remote node running")
        # Live: deltas flow over the link (the first reading was a one-shot snapshot).
        wait_for(lambda: follower.records > 0, timeout=60, what="live records over the ssh link")
        assert nodes.sshd.drop_links() >= 1
        wait_for(lambda: "unreachable" in seen, timeout=60, what="the node unreachable")
        assert follower.reading.reach.tries >= 1
        wait_for(lambda: seen[-1] == "running", timeout=60, what="the link back")
        i = seen.index("unreachable")
        assert "dead" not in seen and seen[i - 1] == "running" and seen[-1] == "running", seen
    finally:
        follower.stop()


def test_job_kill_stops_both_nodes(nodes: TwoNodes) -> None:
    d = nodes.job_json()
    pids = [r["pid"] for r in d["ranks"]]
    out = nodes.cli("job", nodes.run0, nodes.remote, "--kill", "--yes", "--grace", "5", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), timeout=60, what="every rank gone")
    j = nodes.job_json()
    assert all(n["exit"]["code"] is not None or n["exit"]["signal"] is not None for n in j["nodes"]), j[
        "nodes"
    ]
