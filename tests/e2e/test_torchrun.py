"""torchrun under a keeper: `torchrun --nproc_per_node=2` (gloo, CPU, --standalone) running the
small DDP trainer, uninstrumented and with the SDK on every rank.

torch elastic starts each worker in a session of its own, so none of this holds unless the
keeper finds the workers through the process tree: status lists both ranks with their pids (the
real workers: children of torchrun carrying RANK), a SIGSTOPped worker is HUNG naming its rank, a
SIGKILLed one is DEAD headlined with its rank and signal before torchrun's exit code 1, and the
kill action stops every worker, even ones torchrun's death left orphaned.

Every process touched here is one this test started (a worker's pid comes from status and is
checked to be a child of this run's torchrun, carrying this run's id); the `trhome` fixture tears
down whatever carries the test's TRAINROOM_HOME.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, status, status_json
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal.file import read_journal
from trainroom.core.probes.workers import rank_env
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.run.store import JOURNAL_NAME, RunInfo
from trainroom.core.wire import protocol as p

TRAINER = Path(__file__).resolve().parents[1] / "support" / "trainers_ddp" / "train_ddp.py"
START_S = 180  # two ranks importing torch on a loaded 2-core machine
WATCH_S = 60


def _torchrun(cwd: Path, *trainer_args: str) -> RunInfo:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(TRAINER),
        "--step-delay",
        "0.1",
        *trainer_args,
    ]
    return launch(argv, LaunchOptions(linger_s=120), cwd=str(cwd))


def _two_ranks(info: RunInfo, *, connected: bool = False) -> dict[str, Any]:
    """Status once both ranks are listed with a live pid and training has begun."""

    def ready() -> dict[str, Any] | None:
        d = status(info)
        rows = d["ranks"]
        ok = (
            [r["rank"] for r in rows] == [0, 1]
            and all(r["pid"] and r["state"] in ("running", "sleeping") for r in rows)
            and (d["step"] or 0) >= 2
            and (not connected or all(r["connected"] for r in rows))
        )
        return d if ok else None

    try:
        d: dict[str, Any] = wait_for(ready, timeout=START_S, what="two ranks with pids, stepping")
    except AssertionError as exc:  # what status said last, and what the trainer printed
        last = status(info)
        seen = {k: last.get(k) for k in ("state", "step", "pid", "ranks", "findings")}
        log = (Path(info.run_dir) / "trainer.log").read_text(errors="replace")[-800:]
        raise AssertionError(f"{exc}\nstatus: {seen}\ntrainer.log: {log}") from None
    return d


def _pids(d: dict[str, Any]) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in d["ranks"]}


def _check_real_workers(d: dict[str, Any], run_id: str) -> None:
    """The listed pids are this run's torchrun workers: children of its leader, in a session of
    their own, their environment naming the rank status gives them and this run."""
    for rank, pid in _pids(d).items():
        proc = psutil.Process(pid)
        assert proc.ppid() == d["pid"], (rank, pid, proc.ppid(), d["pid"])
        assert os.getsid(pid) == pid != d["pgid"]  # a session of its own: not the attempt's group
        env = rank_env(pid)
        assert env is not None and env.rank == rank and env.run == run_id
        assert env.local_rank == rank and env.world_size == 2


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _hung_naming(info: RunInfo, rank: int) -> dict[str, Any]:
    def hung() -> dict[str, Any] | None:
        d = status(info)
        f = _finding(d, "HUNG")
        return d if d["state"] == "hung" and f is not None and f["evidence"].get("rank") == rank else None

    d: dict[str, Any] = wait_for(hung, timeout=WATCH_S, what=f"HUNG naming rank {rank}")
    return d


def test_uninstrumented_torchrun_ranks_hang_and_death_name_the_rank(trhome: Path, tmp_path: Path) -> None:
    info = _torchrun(tmp_path)
    d = _two_ranks(info)
    _check_real_workers(d, info.run_id)
    pids = _pids(d)
    assert d["instrumented"] is False and all(r["local_rank"] == r["rank"] for r in d["ranks"])

    # A stopped worker: HUNG within a probe cycle or two, naming its rank (not torchrun's pid).
    os.kill(pids[0], signal.SIGSTOP)
    d = _hung_naming(info, 0)
    f = _finding(d, "HUNG")
    assert f is not None and f["evidence"]["pid"] == pids[0] and f["evidence"]["cause"] == "stopped"
    assert f"rank 0 (pid {pids[0]}) is stopped" in f["message"]
    assert next(r for r in d["ranks"] if r["rank"] == 0)["state"] == "stopped"
    os.kill(pids[0], signal.SIGCONT)
    wait_for(lambda: status(info)["state"] == "running", timeout=WATCH_S, what="running again after SIGCONT")

    # A worker killed by SIGKILL: DEAD at once (torchrun has no restart left), the rank and its
    # signal first; torchrun's own exit code 1 second, once it has stopped rank 0.
    os.kill(pids[1], signal.SIGKILL)
    d = wait_for(
        lambda: (x := status(info))["state"] == "dead" and x, timeout=WATCH_S, what="the attempt dead"
    )
    assert d["state_reason"].startswith(f"rank 1 killed by SIGKILL (pid {pids[1]}); ")
    d = wait_for(
        lambda: (x := status(info))["exit"]["code"] is not None and x, timeout=WATCH_S, what="torchrun's exit"
    )
    assert d["exit"] == {"code": 1, "signal": None, "signal_name": None}  # torchrun's own
    assert d["state_reason"] == f"rank 1 killed by SIGKILL (pid {pids[1]}); then torchrun exit code 1"
    # Recorded when it happened, from the kernel, before torchrun's exit; DEAD said before it too.
    records = list(read_journal(Path(info.run_dir) / JOURNAL_NAME))
    (ended,) = [r for r in records if isinstance(r, p.AttemptEnded)]
    gone = [r for r in records if isinstance(r, p.WorkerEnded) and r.pid == pids[1]]
    assert gone[0].exit_signal == signal.SIGKILL and gone[0].source == "wait-status" and gone[0].t < ended.t
    dead_at = [r.t for r in records if isinstance(r, p.RunStatus) and r.state == "dead"]
    assert dead_at and dead_at[0] <= ended.t
    dead = _finding(d, "DEAD")
    assert dead is not None
    assert dead["message"].startswith(f"attempt 1: rank 1 killed by SIGKILL (pid {pids[1]}) at step ")
    assert "(no traceback); then torchrun exit code 1" in dead["message"]
    assert dead["evidence"]["rank"] == 1
    worker = dead["evidence"]["worker"]
    assert worker["pid"] == pids[1] and worker["signal"] == "SIGKILL" and worker["exit_signal"] == 9
    rows = {r["rank"]: r for r in d["ranks"]}
    assert rows[1]["state"] == "dead" and rows[1]["exit"]["signal_name"] == "SIGKILL"
    assert rows[0]["pid"] == pids[0] and rows[0]["state"] == "dead"  # torchrun stopped it after

    # The same from the journal, as `status --json` of the CLI reads it.
    j = status_json(info.run_id)
    assert {r["rank"]: r["pid"] for r in j["ranks"]} == pids
    assert j["state"] == "dead" and j["state_reason"] == d["state_reason"]


def test_sdk_torchrun_stopped_worker_is_hung_and_kill_stops_every_worker(
    trhome: Path, tmp_path: Path
) -> None:
    info = _torchrun(tmp_path, "--sdk")
    d = _two_ranks(info, connected=True)
    _check_real_workers(d, info.run_id)
    pids = _pids(d)
    assert d["instrumented"] is True

    os.kill(pids[1], signal.SIGSTOP)
    d = _hung_naming(info, 1)
    f = _finding(d, "HUNG")
    assert f is not None and f["evidence"]["pid"] == pids[1]
    assert d["state_reason"] == f"rank 1 (pid {pids[1]}) stopped (state T)"
    # HUNG's key (dump stacks) is for the stopped rank, not torchrun.
    c = KeeperClient(info.sock)
    try:
        plan = c.call("dump", {}, confirm=False)
    finally:
        c.close()
    assert plan.plan["pid"] == pids[1], plan

    # The kill action reaches the workers in their own sessions, the stopped one included.
    out = run_cli("kill", info.run_id, "--yes", "--grace", "2", "--json", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for pid in pids.values():
        assert _gone(pid), f"worker {pid} survived the kill"
    assert not psutil.pid_exists(d["pid"]) or _gone(d["pid"])
    assert all(str(pid) in out.stdout for pid in pids.values())


def test_kill_reaches_workers_that_torchrun_left_orphaned(trhome: Path, tmp_path: Path) -> None:
    info = _torchrun(tmp_path)
    d = _two_ranks(info)
    pids = _pids(d)
    torchrun = d["pid"]
    # torchrun dies without stopping its workers: they train on, reparented away from it.
    os.kill(torchrun, signal.SIGKILL)
    d = wait_for(lambda: (x := status(info))["state"] == "dead" and x, timeout=WATCH_S, what="dead")
    assert d["exit"]["signal_name"] == "SIGKILL"
    assert all(not _gone(pid) and psutil.Process(pid).ppid() != torchrun for pid in pids.values())
    dead = _finding(d, "DEAD")
    assert dead is not None and dead["message"].startswith("attempt 1 killed by SIGKILL")
    assert f"still running: rank 0 (pid {pids[0]}), rank 1 (pid {pids[1]})" in dead["message"]

    c = run_cli("kill", info.run_id, "--yes", "--grace", "2", "--json", timeout=120)
    assert c.returncode == 0, c.stdout + c.stderr
    for pid in pids.values():
        assert wait_for(lambda pid=pid: _gone(pid), timeout=30, what=f"orphaned worker {pid} gone")

    # The keeper follows them to the end: no rank is left "still running" in the headline. (How
    # each ended is known only if its zombie was read before init reaped it: dead, else gone.)
    # The DEAD finding is re-said on the keeper's next tick after the ranks' ends: wait for both.
    def settled() -> dict | None:
        x = status(info)
        f = _finding(x, "DEAD")
        ended = all(r["state"] in ("dead", "gone") for r in x["ranks"])
        return x if ended and f is not None and "still running" not in f["message"] else None

    wait_for(settled, timeout=WATCH_S, what="both orphans recorded as ended, and DEAD says so")


@pytest.fixture(autouse=True)
def _no_inherited_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # A RANK in this test's own environment would make torchrun itself look like a rank.
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
