"""`trainroom bridge [RUN] [--job NAME]`: the remote end of `ssh://` targets, run by ssh.

It resolves the run on this host, writes one hello frame (the run, this host's name, whether its
keeper answers) on stdout, then relays the keeper protocol's frames between stdio and the
keeper's socket until either side closes, the way `docker system dial-stdio` does. With the
keeper gone (or not answering), it answers a subscribe from the run's journal and refuses a
request, naming this host. Nothing else is ever written on stdout; errors go to stderr.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import sys
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.cli.errors import EXIT_BAD_INPUT
from trainroom.core.job.discover import newest_run_of
from trainroom.core.remote.relay import relay, write_all
from trainroom.core.remote.wire import BridgeHello
from trainroom.core.run import store
from trainroom.core.run.address import is_remote
from trainroom.core.run.client import BUSY_TRIES
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.vocab import KeeperWord
from trainroom.core.wire import protocol as p

STDIN, STDOUT = 0, 1


def add_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "bridge",
        help="relay a run's keeper over stdin/stdout (what ssh:// targets run on the remote host)",
    )
    sp.add_argument("run", nargs="?", help="the run (default: the newest, or the newest of --job)")
    sp.add_argument("--job", help="the newest run of this job, when no RUN is given")
    sp.add_argument("--host", help="with --job: only runs whose job names this node (SLURMD_NODENAME)")
    sp.add_argument(
        "--all",
        action="store_true",
        help="with --job: a hello and a snapshot for the newest run of each rank of the job here, "
        "then exit (what `trainroom job slurm:JOBID` reads, one srun per node)",
    )
    sp.add_argument(
        "--lines",
        action="store_true",
        help="with --all: each frame as one base64 text line (`TRB ...`), so srun can gather every "
        "node's answer in one step (--label); --host defaults to SLURMD_NODENAME",
    )
    sp.set_defaults(func=cmd_bridge)


def _pick(run: str | None, job: str | None) -> RunInfo:
    if run and is_remote(run):
        raise RunError("the bridge serves this host's runs only (no ssh:// hop)")
    if job and not run:
        return newest_run_of(job)
    return store.resolve_run(run)


def _keeper(info: RunInfo) -> tuple[socket.socket | None, KeeperWord]:
    """A connection to the run's keeper, and what to call it: alive, busy (lives, does not take
    the connection), gone."""
    if not info.alive:
        return None, "gone"
    for timeout in BUSY_TRIES:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(info.sock)
            return s, "alive"
        except (TimeoutError, BlockingIOError):
            s.close()
            continue
        except OSError:
            s.close()
            return None, "gone"
    rec = store.read_record(Path(info.run_dir))
    return None, "busy" if store.keeper_alive(rec) else "gone"


def _send(msg: object) -> None:
    write_all(STDOUT, p.frame(msg))


def cmd_bridge(args: argparse.Namespace) -> int:
    host = socket.gethostname()
    if getattr(args, "all", False):
        lines = getattr(args, "lines", False)
        node = getattr(args, "host", None) or (os.environ.get("SLURMD_NODENAME") if lines else None)
        return _all_of_job(args.job, node, host, lines)
    try:
        info = _pick(args.run, args.job)
        rec = store.read_record(Path(info.run_dir))
    except RunError as exc:
        _send(BridgeHello(host=host, ok=False, error=str(exc)))
        return EXIT_BAD_INPUT
    sock, keeper = _keeper(info)
    job = rec.options.job
    _send(
        BridgeHello(
            host=host,
            run_id=info.run_id,
            run_dir=info.run_dir,
            created=info.created,
            argv=info.argv,
            keeper=keeper,
            job=job.name if job is not None else None,
            node_rank=job.node_rank if job is not None else None,
        )
    )
    if sock is None:
        return _without_keeper(info, keeper, host)
    try:
        why = relay(STDIN, STDOUT, sock)
    finally:
        sock.close()
    if "failed" in why:
        print(f"trainroom bridge: {why}", file=sys.stderr)
    return 0


def _without_keeper(info: RunInfo, keeper: KeeperWord, host: str) -> int:
    """One answer from the journal: a subscribe gets its replay, a request its refusal."""
    reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
    while True:
        data = os.read(STDIN, 1 << 16)
        if not data:
            return 0
        try:
            msgs = reader.feed(data)
        except p.ProtocolError as exc:  # not the keeper protocol on stdin: say so on one line
            print(f"trainroom bridge: {exc} on stdin", file=sys.stderr)
            return EXIT_BAD_INPUT
        for msg in msgs:
            if isinstance(msg, p.Subscribe):
                _send(store.load_view(info.run_dir).to_snapshot())
                return 0
            if isinstance(msg, p.Request):
                why = "gone" if keeper == "gone" else "not answering (busy)"
                _send(
                    p.Reply(
                        id=msg.id,
                        action=msg.action,
                        stage="done",
                        ok=False,
                        message=f"{msg.action}: the keeper of {info.run_id} on {host} is {why}",
                    )
                )
                return 0


def _all_of_job(job: str | None, node: str | None, host: str, lines: bool = False) -> int:
    """Every rank's newest run of `job` here (on `node`): a hello and a snapshot each, then EOF."""
    from trainroom.core.job.discover import job_runs
    from trainroom.core.run.client import read_run

    if not job:
        _send(BridgeHello(host=host, ok=False, error="--all needs --job NAME"))
        return EXIT_BAD_INPUT
    newest: dict[int | None, tuple[RunInfo, Any]] = {}
    for info in job_runs(job):
        try:
            rec = store.read_record(Path(info.run_dir))
        except RunError:
            continue
        j = rec.options.job
        if j is None or (node and j.host != node):
            continue
        newest[j.node_rank] = (info, j)  # job_runs is oldest first: the newest run per rank wins
    for info, j in newest.values():
        try:
            state, keeper = read_run(info)
        except (RunError, OSError) as exc:
            print(f"trainroom bridge: {info.run_id}: {exc}", file=sys.stderr)
            continue
        said = BridgeHello(
            host=j.host or host,
            run_id=info.run_id,
            run_dir=info.run_dir,
            created=info.created,
            argv=info.argv,
            keeper=keeper,
            job=j.name,
            node_rank=j.node_rank,
        )
        snap = p.Snapshot(v=p.PROTOCOL_VERSION, state=msgspec.to_builtins(state))
        if lines:
            for msg in (said, snap):
                line = b"TRB " + base64.b64encode(p.frame(msg)[p.HEADER.size :]) + b"\n"
                write_all(STDOUT, line)
        else:
            _send(said)
            _send(snap)
    return 0
