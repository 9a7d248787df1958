"""Two "nodes" of one torchrun job on this machine: node 0 under the test's TRAINROOM_HOME, node 1
under a second home reached only through ssh:// (the test's sshd), each a keeper running
`torchrun --nnodes=2 --nproc-per-node=1 --node-rank=I` (gloo, c10d rendezvous on 127.0.0.1) with
the tiny DDP trainer in tests/support/remote_trainers."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli
from tests.support.sshd import Sshd, remote_command
from tests.support.waiting import kill_runs_under, wait_for

TRAINER = Path(__file__).parent / "remote_trainers" / "ddp_train.py"


@dataclass
class TwoNodes:
    job: str
    home0: Path
    home1: Path
    run0: str
    run1: str
    sshd: Sshd
    env: dict[str, str]  # the environment node 0's commands run with (ssh settings included)

    @property
    def remote(self) -> str:
        return self.sshd.target(self.run1)

    def cli(self, *args: str, timeout: float = 90) -> Any:
        return run_cli(*args, env=self.env, timeout=timeout)

    def job_json(self, *extra: str) -> dict[str, Any]:
        out = self.cli("job", self.run0, self.remote, "--json", *extra)
        assert out.returncode in (0, 1), out.stderr
        d: dict[str, Any] = json.loads(out.stdout)
        return d

    def rank(self, d: dict[str, Any], rank: int) -> dict[str, Any] | None:
        return next((r for r in d["ranks"] if r["rank"] == rank), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(node_rank: int, port: int, job: str, *trainer_args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={job}",
        # Node 0 hosts the rendezvous store; deterministic where both nodes share one host name.
        f"--rdzv-conf=is_host={1 if node_rank == 0 else 0}",
        "--max-restarts=0",
        str(TRAINER),
        *trainer_args,
    ]


def start_two_nodes(trhome: Path, sshd: Sshd, *trainer_args: str) -> Iterator[TwoNodes]:
    home1 = Path(tempfile.mkdtemp(prefix="tr1", dir="/tmp"))
    job = f"job-{secrets.token_hex(3)}"
    port = _free_port()
    env0 = dict(
        os.environ,
        TRAINROOM_HOME=str(trhome),
        TRAINROOM_SSH_COMMAND=sshd.ssh_command,
        TRAINROOM_REMOTE_COMMAND=remote_command(home1),
    )
    env1 = dict(os.environ, TRAINROOM_HOME=str(home1))
    try:
        runs = []
        # Node 0 first: c10d assigns group ranks by (host, agent pid), so on one host the agent
        # started first is group rank 0 and its worker global rank 0 (torchrun's --node-rank is
        # not what c10d goes by).
        for node, env in ((0, env0), (1, env1)):
            out = run_cli("launch", "--", *torchrun(node, port, job, *trainer_args), env=env)
            assert out.returncode == 0, out.stderr
            runs.append(out.stdout.strip())
        nodes = TwoNodes(job, trhome, home1, runs[0], runs[1], sshd, env0)

        def both_stepping() -> bool:
            d = nodes.job_json()
            steps = [r["step"] for r in d["ranks"]]
            return len(steps) == 2 and all(s is not None and s > 3 for s in steps)

        wait_for(both_stepping, timeout=180, interval=1.0, what="both ranks of the job stepping")
        yield nodes
    finally:
        kill_runs_under(home1)
        shutil.rmtree(home1, ignore_errors=True)


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    from tests.support.sshd import start_sshd

    yield from start_sshd()
