"""`trainroom job slurm:JOBID`: a Slurm job's runs, read from the login node.

slurmctld gives the job (state, reason, time left, restarts, exit codes) and its nodes (DOWN,
DRAIN and why): one `scontrol show job -o` and one `scontrol show node -o` per refresh at most,
cached for 3 s (core/slurm/scontrol.py). Each node's keepers are reached inside the job, with no
SSH into compute nodes: `srun --jobid=JOBID --overlap -N1 -n1 -w NODE trainroom bridge --job
slurm-JOBID --host NODE --all` writes a hello and a snapshot for every task's run there (the
newest per rank: a requeued job's latest attempt). A node srun cannot reach, or a job that has
ended, is read from the runs this host can see (a shared home directory), said so.

The verdicts Slurm does not give: a node whose slurmd does not answer while slurmctld still calls
it allocated is NODE_LOST (slurmctld marks it DOWN only after SlurmdTimeout, 300 s by default);
the job's end (OUT_OF_MEMORY, TIMEOUT, CANCELLED, NODE_FAIL, PREEMPTED) and DerivedExitCode are
said in words beside the ranks' own verdicts (core/job/view.py: the first rank to die, hangs).
"""

from __future__ import annotations

import base64
import os
import shlex
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.job.discover import job_runs
from trainroom.core.job.view import NodeReading
from trainroom.core.remote.ssh import ENV_REMOTE_COMMAND
from trainroom.core.remote.wire import BridgeHello, read_hello
from trainroom.core.run import store
from trainroom.core.run.client import read_run
from trainroom.core.run.state import from_snapshot
from trainroom.core.run.store import RunError
from trainroom.core.slurm.scontrol import JobInfo, NodeInfo, SlurmError, SlurmReader, exit_words
from trainroom.core.wire import protocol as p

SRUN_TIMEOUT_S = 20.0
MAX_OUTPUT = 64 << 20
LIVE = ("RUNNING", "COMPLETING", "SUSPENDED", "STOPPED")
# What each end state means, in words (Slurm's own names stay beside them).
END_WORDS = {
    "COMPLETED": "completed (every task exited 0: a rank killed by a signal shows in DerivedExitCode)",
    "FAILED": "failed: a task exited non-zero",
    "CANCELLED": "cancelled (scancel, or an administrator)",
    "TIMEOUT": "ended by its time limit",
    "OUT_OF_MEMORY": "out of memory: the cgroup's memory limit killed a task (OOM)",
    "NODE_FAIL": "a node failed (slurmctld lost it): the job was ended",
    "PREEMPTED": "preempted by a higher-priority job",
    "BOOT_FAIL": "a node failed to boot",
    "DEADLINE": "ended by its deadline",
    "PENDING": "waiting to start",
    "REQUEUED": "requeued: it will start again",
}
# How bad each end is (the findings' severities): what the job screen colours a verdict by.
END_SEVERITY = {
    "COMPLETED": "info",
    "REQUEUED": "info",
    "CANCELLED": "warning",
    "TIMEOUT": "warning",
    "PREEMPTED": "warning",
    "DEADLINE": "warning",
}


class SlurmJobError(RuntimeError):
    """The job cannot be shown at all (no such job here or in slurmctld): one line."""


@dataclass
class SlurmJob:
    job_id: str
    name: str
    info: JobInfo | None
    nodes: dict[str, NodeInfo]
    readings: list[NodeReading]
    lost: dict[str, str] = field(default_factory=dict)  # node -> why srun could not reach it
    source: dict[str, str] = field(default_factory=dict)  # node -> "srun" or "local runs"
    calls: int = 0
    error: str | None = None


def job_name_of(info: JobInfo | None, job_id: str) -> str:
    if info is not None and info.array_job_id and info.array_task_id and info.array_task_id.isdigit():
        return f"slurm-{info.array_job_id}_{info.array_task_id}"
    return f"slurm-{job_id}"


def _srun_env() -> dict[str, str]:
    """Our environment without a surrounding job's SLURM_* (the watcher may itself run in one)."""
    keep = ("SLURM_CONF",)
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k in keep}


def srun_argv(job_id: str, node: str, name: str) -> list[str]:
    remote = shlex.split(os.environ.get(ENV_REMOTE_COMMAND) or "trainroom")
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "-N1",
        "-n1",
        "-w",
        node,
        "--quiet",
        *remote,
        "bridge",
        "--job",
        name,
        "--host",
        node,
        "--all",
    ]


SLURMD_PORT = 6818
PROBE_TIMEOUT_S = 2.0
# A node that has not answered the job's srun step this long after it started has its slurmd probed.
PROBE_AFTER_S = 2.0
STOP_WAIT_S = 2.0


def slurmd_silent(ni: NodeInfo | None) -> str | None:
    """Why the node's slurmd cannot be reached (a TCP connect to NodeAddr:Port, where srun would
    connect too: no Slurm RPC), in words with what was tried; None when it accepts a connection
    or its address is unknown."""
    if ni is None or not ni.addr:
        return None
    port = ni.port or SLURMD_PORT
    try:
        with socket.create_connection((ni.addr, port), timeout=PROBE_TIMEOUT_S):
            return None
    except TimeoutError:
        return f"a TCP connect to its slurmd at {ni.addr}:{port} got no answer within {PROBE_TIMEOUT_S:.0f} s"
    except ConnectionRefusedError:
        return f"a TCP connect to its slurmd at {ni.addr}:{port} was refused: nothing listens there"
    except OSError as exc:
        return f"a TCP connect to its slurmd at {ni.addr}:{port} failed: {exc.strerror or exc}"


def srun_act(job_id: str, node: str, verb_args: list[str]) -> tuple[int, str]:
    """`trainroom VERB_ARGS` on `node` inside the job (one srun step); its exit and last line."""
    rc, stdout, stderr = srun_run(job_id, node, verb_args)
    text = (stdout.strip() or stderr.strip()).splitlines()
    return rc, " ".join(text[-1:]) if not stdout.strip().startswith("{") else _message(stdout)


def srun_run(job_id: str, node: str, verb_args: list[str], timeout_s: float = 120.0) -> tuple[int, str, str]:
    """`trainroom VERB_ARGS` on `node` inside the job (one srun step): exit, stdout, stderr."""
    remote = shlex.split(os.environ.get(ENV_REMOTE_COMMAND) or "trainroom")
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "-N1",
        "-n1",
        "-w",
        node,
        "--quiet",
        *remote,
        *verb_args,
    ]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=_srun_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", str(exc)
    return out.returncode, out.stdout, out.stderr


def _message(text: str) -> str:
    try:
        d = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text.strip()[-300:]
    return str(d.get("message", d)) if isinstance(d, dict) else str(d)


def _frames(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at + p.HEADER.size <= len(data):
        (n,) = p.HEADER.unpack_from(data, at)
        at += p.HEADER.size
        if n > p.MAX_OUTBOUND_FRAME or at + n > len(data):
            break
        out.append(data[at : at + n])
        at += n
    return out


def read_node_srun(job_id: str, node: str, name: str) -> list[NodeReading]:
    """Every run of the job on `node`, through one srun step there. Raises OSError (with srun's
    last words) when the node cannot be reached."""
    try:
        proc = subprocess.run(
            srun_argv(job_id, node, name),
            capture_output=True,
            timeout=SRUN_TIMEOUT_S,
            env=_srun_env(),
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise OSError("srun: not found (is Slurm installed on this host?)") from None
    except subprocess.TimeoutExpired:
        raise OSError(f"srun to {node}: no answer within {SRUN_TIMEOUT_S:.0f} s") from None
    frames = _frames(proc.stdout[:MAX_OUTPUT])
    if proc.returncode != 0 and not frames:
        lines = [x for x in proc.stderr.decode(errors="replace").splitlines() if x.strip()]
        raise OSError(f"srun to {node} exited {proc.returncode}: {lines[-1] if lines else 'no output'}")
    out = []
    for head, body in zip(frames[::2], frames[1::2], strict=False):
        try:
            hello: BridgeHello = read_hello(head)
            snap = p.keeper_decoder.decode(body)
            if not isinstance(snap, p.Snapshot) or not hello.ok:
                continue
            state = from_snapshot(snap.state)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
            continue  # one run that does not decode costs that run, not the node
        out.append(
            NodeReading(
                target=f"slurm:{job_id}/{node}",
                host=hello.host,
                run=hello.run_id,
                state=state,
                keeper=hello.keeper,
            )
        )
    return out


def srun_all_argv(job_id: str, nodes: list[str], name: str) -> list[str]:
    remote = shlex.split(os.environ.get(ENV_REMOTE_COMMAND) or "trainroom")
    n = str(len(nodes))
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--quiet",
        "--label",
        *remote,
        "bridge",
        "--job",
        name,
        "--all",
        "--lines",
    ]


def _reading(job_id: str, node: str, head: bytes, body: bytes) -> NodeReading | None:
    try:
        hello: BridgeHello = read_hello(head)
        snap = p.keeper_decoder.decode(body)
        if not isinstance(snap, p.Snapshot) or not hello.ok:
            return None
        state = from_snapshot(snap.state)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError):
        return None  # one run that does not decode costs that run, not the node
    return NodeReading(
        target=f"slurm:{job_id}/{node}", host=hello.host, run=hello.run_id, state=state, keeper=hello.keeper
    )


def _probe_all(nodes: list[str], infos: dict[str, NodeInfo]) -> dict[str, str]:
    """The nodes whose slurmd does not accept a connection, and why (connects in parallel)."""
    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
        said = dict(zip(nodes, pool.map(lambda n: slurmd_silent(infos.get(n)), nodes), strict=True))
    late = f"it had not answered the job's srun step within {PROBE_AFTER_S:.0f} s"
    return {n: f"{late}; {why}" for n, why in said.items() if why is not None}


def _stop_srun(proc: subprocess.Popen[bytes]) -> None:
    """End an srun we started that waits on a lost node (SIGTERM: srun cancels its step; then
    SIGKILL if it is still in its launch)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_WAIT_S)


def read_all_srun(
    job_id: str, nodes: list[str], name: str, infos: dict[str, NodeInfo] | None = None
) -> tuple[dict[str, list[NodeReading]], dict[str, str]]:
    """Every node's runs through ONE srun step across the job's nodes (one task per node, each
    frame a labelled base64 line, read as it comes): one step for slurmctld per refresh, whatever
    the node count. Nodes that answered nothing are absent (the caller asks each of them alone).

    srun waits MessageTimeout (10 s by default) on a node whose slurmd is gone before it fails
    the whole step. So the nodes that have not answered after PROBE_AFTER_S are probed (a TCP
    connect to their slurmd, refused or PROBE_TIMEOUT_S): when one is silent, the step cannot
    complete: srun is stopped, what came so far is kept, and the silent nodes are returned with
    why (the second value). A healthy job's refresh probes nothing (each probe is a line in
    slurmd's log: `slurm_receive_msg: Zero Bytes were transmitted or received`)."""
    infos = infos or {}
    try:
        proc = subprocess.Popen(
            srun_all_argv(job_id, nodes, name),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_srun_env(),
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return {}, {}
    frames: dict[int, list[bytes]] = {}
    heard: set[str] = set()
    lock = threading.Lock()

    def read() -> None:
        assert proc.stdout is not None
        size = 0
        for raw in proc.stdout:
            size += len(raw)
            if size > MAX_OUTPUT:
                continue  # drained, not kept
            label, sep, rest = raw.rstrip(b"\n").partition(b": ")
            if not sep or not label.strip().isdigit() or not rest.startswith(b"TRB "):
                continue
            try:
                frame = base64.b64decode(rest[4:], validate=True)
            except ValueError:
                continue
            with lock:
                got = frames.setdefault(int(label), [])
                got.append(frame)
                r = _reading(job_id, "?", got[-2], got[-1]) if len(got) % 2 == 0 else None
                if r is not None and r.host:
                    heard.add(r.host)

    reader = threading.Thread(target=read, name="trainroom-srun-read", daemon=True)
    reader.start()
    silent: dict[str, str] = {}
    try:
        proc.wait(timeout=PROBE_AFTER_S)
    except subprocess.TimeoutExpired:
        with lock:
            late = [n for n in nodes if n not in heard]
        silent = _probe_all(late, infos)
        try:
            if silent:
                _stop_srun(proc)
            else:
                proc.wait(timeout=max(0.0, SRUN_TIMEOUT_S - PROBE_AFTER_S))
        except subprocess.TimeoutExpired:
            _stop_srun(proc)
    reader.join(timeout=STOP_WAIT_S)
    out: dict[str, list[NodeReading]] = {}
    with lock:
        tasks = list(frames.values())
    for got in tasks:
        # Each task's node is the one its runs name (SLURMD_NODENAME at launch): a node without a
        # run of the job answers nothing here and is asked alone.
        readings = [_reading(job_id, "?", h, b) for h, b in zip(got[::2], got[1::2], strict=False)]
        for r in readings:
            if r is not None and r.host in nodes and r.host not in silent:
                r.target = f"slurm:{job_id}/{r.host}"
                out.setdefault(r.host, []).append(r)
    return out, silent


def read_node_local(job_id: str, name: str, node: str | None) -> list[NodeReading]:
    """The job's runs this host can see (a shared home), newest per rank; `node` None: all."""
    newest: dict[tuple[str | None, int | None], Any] = {}
    for info in job_runs(name):
        try:
            job = store.read_record(Path(info.run_dir)).options.job
        except RunError:
            continue
        if job is None or (node is not None and job.host != node):
            continue
        newest[(job.host, job.node_rank)] = (info, job)
    out = []
    for info, job in newest.values():
        try:
            state, keeper = read_run(info)
        except (RunError, OSError):
            continue
        out.append(
            NodeReading(
                target=f"slurm:{job_id}/{job.host}",
                host=job.host,
                run=info.run_id,
                state=state,
                keeper=keeper,
            )
        )
    return out


def read_slurm_job(job_id: str, reader: SlurmReader, *, now: float | None = None) -> SlurmJob:
    if not job_id.isdigit() and not (job_id.count("_") == 1 and job_id.replace("_", "").isdigit()):
        raise SlurmJobError(f"slurm:{job_id}: expected a job id (digits, or ARRAYJOB_TASK)")
    error = None
    try:
        info = reader.job(job_id)
        nodes = reader.nodes(info.nodes) if info is not None and info.nodes else {}
    except SlurmError as exc:
        info, nodes, error = None, {}, str(exc)
    name = job_name_of(info, job_id)
    job = SlurmJob(job_id=job_id, name=name, info=info, nodes=nodes, readings=[], error=error)
    names = info.nodes if info is not None else []
    live = info is not None and info.state in LIVE
    t = time.time() if now is None else now

    gathered, silent = read_all_srun(job_id, names, name, nodes) if live and names else ({}, {})

    def one(node: str) -> list[NodeReading]:
        why = silent.get(node) or (slurmd_silent(nodes.get(node)) if live else None)
        if why is not None:
            job.lost[node] = why
        elif live:
            try:
                got = read_node_srun(job_id, node, name)
                job.source[node] = "srun"
                return got
            except OSError as exc:
                job.lost[node] = str(exc)
        local = read_node_local(job_id, name, node)
        if local:
            # Its journals are here (a shared home): the ranks' verdicts stand whatever srun said;
            # srun's failure is kept for the node's own verdict (NODE_LOST).
            job.source[node] = "local runs (this host sees the node's run directory)"
            return local
        unheard = NodeReading(target=f"slurm:{job_id}/{node}", host=node)
        unheard.reach.lost(t, job.lost.get(node, "no run of this job was found on this node"), None)
        return [unheard]

    for node, got in gathered.items():
        job.source[node] = "srun"
        job.readings += got
    rest = [n for n in names if n not in gathered]
    if rest:
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(rest)))) as pool:
            for got in pool.map(one, rest):
                job.readings += got
    elif not names:
        job.readings = read_node_local(job_id, name, None)
    job.calls = reader.calls
    if not job.readings and info is None:
        raise SlurmJobError(
            f"slurm:{job_id}: slurmctld does not know the job ({error or 'purged after MinJobAge'}) "
            f"and no run of {name} is under {store.runs_dir()}"
        )
    return job


def eligible_in_s(info: JobInfo | None, now: float) -> float | None:
    """A pending job's wait until slurmctld lets it start (a requeued job waits ~2 min): from its
    EligibleTime (the controller's local time, as scontrol prints it)."""
    if info is None or info.state != "PENDING" or not info.eligible_time:
        return None
    try:
        at = time.mktime(time.strptime(info.eligible_time, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None
    return max(0.0, at - now)


def slurm_view(job: SlurmJob, now: float) -> dict[str, Any]:
    """Slurm's side of the job, and the verdicts Slurm itself does not give."""
    info = job.info
    verdicts: list[dict[str, Any]] = []
    running = info is not None and info.state in ("RUNNING", "COMPLETING")
    for node in info.nodes if info is not None else []:
        ni = job.nodes.get(node)
        why = job.lost.get(node)
        if running and why is not None and (ni is None or not ni.down):
            verdicts.append(
                {
                    "code": "NODE_LOST",
                    "severity": "critical",
                    "node": node,
                    "message": f"node {node} is lost: its slurmd does not answer ({why}); slurmctld still "
                    f"calls it {ni.state if ni else 'allocated'} and marks it DOWN only after SlurmdTimeout",
                }
            )
        elif ni is not None and ni.down:
            verdicts.append(
                {
                    "code": "NODE_LOST",
                    "severity": "critical",
                    "node": node,
                    "message": f"node {node} is {ni.state} in slurmctld"
                    + (f": {ni.reason}" if ni.reason else ""),
                }
            )
    if info is not None and info.state in END_WORDS and info.state not in ("PENDING",):
        verdicts.append(
            {
                "code": f"SLURM_{info.state}",
                "severity": END_SEVERITY.get(info.state, "critical"),
                "node": None,
                "message": END_WORDS[info.state],
            }
        )
    derived = exit_words(info.derived_exit_code) if info is not None else None
    if info is not None and info.derived_exit_code not in (None, "0:0") and derived:
        verdicts.append(
            {
                "code": "SLURM_DERIVED_EXIT",
                "severity": "warning",
                "node": None,
                "message": f"a task of the job was {derived} (DerivedExitCode {info.derived_exit_code})",
            }
        )
    return {
        "job_id": job.job_id,
        "name": job.name,
        "eligible_in_s": eligible_in_s(info, now),
        "job": info.as_dict() if info is not None else None,
        "state_words": END_WORDS.get(info.state) if info is not None else None,
        "exit": exit_words(info.exit_code) if info is not None else None,
        "derived_exit": derived,
        "nodes": [
            {
                **(job.nodes[n].as_dict() if n in job.nodes else {"node": n, "state": "?"}),
                "read_by": job.source.get(n),
            }
            for n in (info.nodes if info is not None else [])
        ],
        "verdicts": verdicts,
        "slurm_queries": job.calls,
        "error": job.error,
    }
