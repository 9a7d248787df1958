"""probes.workers against real processes: a launcher whose rank processes start sessions of
their own (as torch elastic's do), each with a DataLoader-like child that inherits its rank's
environment, and a helper without a rank; zombies' wait statuses; pidfds; and torchrun's failure
summary as this torch writes it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for
from trainroom.core.probes import workers as wk
from trainroom.core.probes.procs import read_stat, scan
from trainroom.core.probes.workers import (
    ExitStatus,
    WorkerFinder,
    decode_wait_status,
    exit_handle,
    launcher_reports,
    rank_env,
    zombie_exit,
)

# A launcher like torchrun: two rank processes, each in a new session with RANK, LOCAL_RANK and
# WORLD_SIZE set at exec; each rank forks a child that inherits it (a DataLoader worker); and a
# helper with no rank. It writes the pids as JSON, then waits.
LAUNCHER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    out = sys.argv[1]
    rank_code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(120)"
    )
    ranks, children = {}, {}
    for r in (0, 1):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                   TORCHELASTIC_MAX_RESTARTS="3", TORCHELASTIC_RESTART_COUNT=str(r))
        path = out + f".child{r}"
        p = subprocess.Popen([sys.executable, "-c", rank_code, path], env=env, start_new_session=True)
        ranks[r] = p.pid
        while not os.path.exists(path) or not open(path).read():
            time.sleep(0.02)
        children[r] = int(open(path).read())
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(out + ".tmp", "w") as f:
        json.dump({"ranks": ranks, "children": children, "helper": helper.pid}, f)
    os.rename(out + ".tmp", out)
    time.sleep(120)
    """
)


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, dict[str, Any]]]:
    """The launcher's pid and what it wrote; every process it started is killed after the test
    (each by its pid, the rank processes' sessions by their own id)."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    env = dict(os.environ, TRAINROOM_RUN="run-workers-test")
    out = tmp_path / "pids.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(out)],
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    info: dict[str, Any] = {}
    try:
        wait_for(out.exists, timeout=60, what="the launcher's pid file")
        info = json.loads(out.read_text())
        info["ranks"] = {int(k): v for k, v in info["ranks"].items()}
        info["children"] = {int(k): v for k, v in info["children"].items()}
        yield proc.pid, info
    finally:
        for pid in info.get("ranks", {}).values():
            _kill_group(pid)  # the rank and its child: the session it leads
        _kill_group(proc.pid)  # the launcher and its helper
        proc.wait(timeout=30)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def test_workers_are_found_through_the_tree_whatever_their_session(
    launcher: tuple[int, dict[str, Any]],
) -> None:
    leader, info = launcher
    found = WorkerFinder().find(scan(), leader)
    assert [(w.rank, w.pid) for w in found] == [(0, info["ranks"][0]), (1, info["ranks"][1])]
    for w in found:
        assert w.local_rank == w.rank and w.world_size == 2 and w.ppid == leader
        assert w.sid == w.pid and w.pgid == w.pid != leader  # torch elastic's start_new_session
        assert w.state in ("S", "R") and w.wait_status is None
        assert w.restarts_left == 3 - w.rank  # torch elastic's budget: max restarts less the count
        assert w.start_ticks == read_stat(w.pid).start_ticks  # type: ignore[union-attr]
    # The rank's own child inherits RANK but is part of its rank, and the helper has no rank.
    listed = {w.pid for w in found}
    assert not listed & {*info["children"].values(), info["helper"]}
    env = rank_env(info["children"][1])
    assert env is not None and env.rank == 1 and env.run == "run-workers-test"
    assert rank_env(info["helper"]) is None
    assert rank_env(leader) is None  # the launcher carries no rank of its own


def test_a_steady_cycle_reads_no_environment_again(
    launcher: tuple[int, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, _info = launcher
    finder = WorkerFinder()
    reads: list[int] = []
    real = wk.run_of

    def counting(pid: int, proc_root: str = "/proc") -> Any:
        reads.append(pid)
        return real(pid, proc_root)

    monkeypatch.setattr(wk, "run_of", counting)
    first = finder.find(scan(), leader)
    assert len(first) == 2 and len(reads) == 6  # the leader, 2 ranks, their 2 children, the helper
    reads.clear()
    assert finder.find(scan(), leader) == first
    assert reads == []


def test_a_leader_with_no_ranks_below_has_no_workers(launcher: tuple[int, dict[str, Any]]) -> None:
    _leader, info = launcher
    assert WorkerFinder().find(scan(), info["helper"]) == []
    assert WorkerFinder().find(scan(), 0) == []


# Lightning's own launcher: the process started is local rank 0 and re-runs itself for each other
# local rank with LOCAL_RANK, NODE_RANK and WORLD_SIZE (no RANK), in its own session and group;
# each rank has a DataLoader-like child. NODE_RANK comes from argv.
LIGHTNING = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    out, node, per_node = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    loader = subprocess.Popen(sleeper)  # rank 0's DataLoader worker: the launcher's own env
    ranks = {}
    for r in range(1, per_node):
        env = dict(os.environ, LOCAL_RANK=str(r), NODE_RANK=node, WORLD_SIZE=str(2 * per_node))
        code = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)"
        ranks[r] = subprocess.Popen([sys.executable, "-c", code, *sleeper], env=env).pid
    with open(out + ".tmp", "w") as f:
        json.dump({"ranks": ranks, "loader": loader.pid}, f)
    os.rename(out + ".tmp", out)
    time.sleep(120)
    """
)


@pytest.mark.parametrize("node,per_node", [(0, 2), (1, 3)])
def test_lightning_ranks_are_named_from_local_rank_and_node_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: int, per_node: int
) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "pids.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", LIGHTNING, str(out), str(node), str(per_node)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(out.exists, timeout=60, what="the launcher's pid file")
        info = json.loads(out.read_text())
        ranks = {int(k): v for k, v in info["ranks"].items()}

        def all_children() -> list[Any] | None:
            found = WorkerFinder().find(scan(), proc.pid)
            kids = [st for st in scan() if st.ppid in ranks.values()]
            return found if len(kids) == len(ranks) else None

        found = wait_for(all_children, timeout=60, what="each rank's child started")
        base = node * per_node
        want = [(base, proc.pid)] + [(base + r, pid) for r, pid in sorted(ranks.items())]
        assert [(w.rank, w.pid) for w in found] == want  # never a default 0 on node 1
        assert [w.local_rank for w in found] == list(range(per_node))
        assert info["loader"] not in {w.pid for w in found}
        if node > 0:  # without the launcher, NODE_RANK > 0 gives no ranks per node: no rank at all
            assert WorkerFinder().find(scan(), ranks[1]) == []
    finally:
        _kill_group(proc.pid)
        proc.wait(timeout=30)


# --------------------------------------------------------------------------- how a worker ended


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def _ticks(pid: int) -> int:
    st = read_stat(pid)
    assert st is not None
    return st.start_ticks


def test_a_zombie_tells_how_it_ended_until_it_is_reaped(
    child: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    killed = child("import time; time.sleep(120)")
    ticks = _ticks(killed.pid)
    assert zombie_exit(killed.pid, ticks) is None  # still running
    os.kill(killed.pid, signal.SIGKILL)
    wait_for(lambda: read_stat(killed.pid).state == "Z", timeout=30, what="a zombie")  # type: ignore[union-attr]
    assert zombie_exit(killed.pid, ticks) == ExitStatus(None, signal.SIGKILL)
    assert zombie_exit(killed.pid, ticks + 1) is None  # another start tick: not that process
    killed.wait()
    assert zombie_exit(killed.pid, ticks) is None  # reaped: nothing left to read

    failed = child("import sys; sys.exit(3)")
    wait_for(lambda: read_stat(failed.pid).state == "Z", timeout=30, what="a zombie")  # type: ignore[union-attr]
    assert zombie_exit(failed.pid, read_stat(failed.pid).start_ticks) == ExitStatus(3, None)  # type: ignore[union-attr]

    clean = child("pass")
    wait_for(lambda: read_stat(clean.pid).state == "Z", timeout=30, what="a zombie")  # type: ignore[union-attr]
    assert zombie_exit(clean.pid, read_stat(clean.pid).start_ticks) == ExitStatus(0, None)  # type: ignore[union-attr]


def test_decode_wait_status() -> None:
    assert decode_wait_status(9) == ExitStatus(None, 9)
    assert decode_wait_status(1 << 8) == ExitStatus(1, None)
    assert decode_wait_status(0) == ExitStatus(0, None)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open here")
def test_a_pidfd_becomes_readable_when_the_process_exits(
    child: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    proc = child("import time; time.sleep(120)")
    ticks = _ticks(proc.pid)
    assert exit_handle(proc.pid, ticks + 1) is None  # the pid names another start: no handle
    fd = exit_handle(proc.pid, ticks)
    assert fd is not None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []
        os.kill(proc.pid, signal.SIGTERM)
        assert poller.poll(30_000)  # a bound for a loaded machine
        assert zombie_exit(proc.pid, ticks) == ExitStatus(None, signal.SIGTERM)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- torchrun's own account

# What torch 2.13's torchrun wrote to trainer.log when rank 1 (pid 767) was killed by SIGKILL.
TORCHRUN_LOG = """\
E1203 12:14:54.784000 744 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 767) of binary: /work/venv-torchrun/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/work/wt-torchrun/tests/support/trainers_ddp/train_ddp.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_12:14:54
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 766)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 766
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_12:14:54
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 767)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 767
============================================================
"""


def test_torchruns_summary_names_the_root_cause_with_rank_pid_and_signal() -> None:
    reps = launcher_reports(TORCHRUN_LOG)
    assert [(r.pid, r.exitcode, r.local_rank, r.rank, r.root_cause) for r in reps] == [
        (767, -9, 1, None, False),  # the agent's line, as it happened
        (766, -15, 0, 0, False),  # stopped by torchrun after: not the cause
        (767, -9, 1, 1, True),
    ]
    assert reps[-1].status == ExitStatus(None, 9)
    assert launcher_reports("iter 3: loss 2.0\nexitcode  : 1 (pid: 5)\n") == []  # no rank line before it


# torchrun's worker between fork and exec: for that moment /proc/<pid>/environ is torchrun's (no
# RANK). The child here holds that moment open (it waits for a file before it execs with RANK).
SLOW_EXEC = textwrap.dedent(
    """
    import os, sys, time
    out, go = sys.argv[1], sys.argv[2]
    pid = os.fork()
    if pid == 0:
        while not os.path.exists(go):
            time.sleep(0.02)
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)"], env)
    open(out, "w").write(str(pid))
    time.sleep(120)
    """
)


def test_a_worker_caught_between_fork_and_exec_is_found_once_it_has_exec_d(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    out, go = tmp_path / "child.pid", tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXEC, str(out), str(go)], start_new_session=True, stdin=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: out.exists() and out.read_text(), timeout=60, what="the forked child's pid")
        child = int(out.read_text())
        finder = WorkerFinder()
        assert finder.find(scan(), proc.pid) == []  # not exec'd: its parent's environment, no rank
        st = read_stat(child)
        assert st is not None and st.env_start == read_stat(proc.pid).env_start  # type: ignore[union-attr]
        go.write_text("")
        wait_for(
            lambda: (s := read_stat(child)) is not None and s.env_start != read_stat(proc.pid).env_start,  # type: ignore[union-attr]
            timeout=60,
            what="the child's exec",
        )
        found = wait_for(lambda: finder.find(scan(), proc.pid), timeout=60, what="the exec'd child as rank 0")
        assert [(w.rank, w.pid) for w in found] == [(0, child)]
    finally:
        _kill_group(proc.pid)
        proc.wait(timeout=30)
