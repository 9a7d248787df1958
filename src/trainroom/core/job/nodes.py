"""The nodes of a job and how each is read: a local run through its socket (or journal), a remote
one through `ssh HOST trainroom bridge [RUN] [--job NAME]`. All nodes are read at once (one thread
each: a slow or unreachable host holds up only itself).

`NodeFollower` keeps one node live for the control room and the benchmark: a subscription folded
as it comes, and on a dropped link "unreachable since T" with reconnects on a backoff; a keeper
that is gone leaves its journal's last state.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec

from trainroom.core.configuration.sections import Host
from trainroom.core.job.discover import job_of, newest_job, newest_run_of
from trainroom.core.job.view import NodeReading
from trainroom.core.remote import reach, ssh
from trainroom.core.remote.link import Backoff, Reachability
from trainroom.core.remote.target import SshTarget, TargetError, configured_hosts, parse_target
from trainroom.core.run import store
from trainroom.core.run.address import is_remote
from trainroom.core.run.client import KeeperClient, KeeperGone, KeeperUnreachable, read_run
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.run.view import RunView


class NodeRef:
    """A node as named: a remote target (its run resolved there, by job name when it names
    none), or a local run."""

    def __init__(self, label: str, remote: SshTarget | None, local: str | None) -> None:
        self.label, self.remote, self.local = label, remote, local

    @property
    def is_remote(self) -> bool:
        return self.remote is not None


def node_refs(targets: list[str], hosts: dict[str, Host] | None = None) -> list[NodeRef]:
    """TARGETs as given (ssh://..., a [hosts] name, or a local run); none: this host's run of the
    job and every host trainroom.toml names."""
    reach.install()  # a job's nodes may be on other hosts
    hosts = configured_hosts() if hosts is None else hosts
    if not targets:
        return [NodeRef("local", None, None)] + [
            NodeRef(name, parse_target(f"ssh://{name}", hosts), None) for name in hosts
        ]
    out = []
    for t in targets:
        try:
            if is_remote(t):
                out.append(NodeRef(t, parse_target(t, hosts), None))
            elif t in hosts:
                out.append(NodeRef(t, parse_target(f"ssh://{t}", hosts), None))
            else:
                out.append(NodeRef(t, None, t))
        except TargetError as exc:
            raise RunError(str(exc)) from None
    return out


def job_name(refs: list[NodeRef], given: str | None) -> str | None:
    """The job to show: as given, else the one of the first local node here, else the newest
    job here (None: remote nodes only, each showing its newest run)."""
    if given:
        return given
    for ref in refs:
        if ref.local is not None:
            job = job_of(store.resolve_run(ref.local))
            if job is not None:
                return job.name
    if any(not r.is_remote for r in refs):
        return newest_job()
    return None


def _local_info(ref: NodeRef, job: str | None) -> RunInfo:
    if ref.local is not None:
        return store.resolve_run(ref.local)
    if job is not None:
        return newest_run_of(job)
    return store.resolve_run(None)


def read_node(ref: NodeRef, job: str | None, now: Callable[[], float] = time.time) -> NodeReading:
    """One snapshot of a node; a remote one that cannot be reached reads unreachable (since now)."""
    if ref.remote is None:
        info = _local_info(ref, job)
        state, keeper = read_run(info)
        return NodeReading(
            target=ref.label, host=socket.gethostname(), run=info.run_id, state=state, keeper=keeper
        )
    target = ref.remote
    try:
        hello, snap = ssh.fetch_snapshot(target, job=job if target.run is None else None)
    except ssh.Unreachable as exc:
        reach = Reachability()
        reach.lost(now(), str(exc), None)
        return NodeReading(target=ref.label, reach=reach)
    except ssh.RemoteRefused as exc:
        raise RunError(str(exc)) from None
    try:
        view = RunView.from_snapshot(snap)
    except msgspec.ValidationError as exc:
        # A word this version does not know (a newer trainroom there): the node reads as one
        # that cannot be heard, with why, not as a crash of the whole job view.
        reach = Reachability()
        reach.lost(
            now(), f"{target}: its state does not decode here (another trainroom version?): {exc}", None
        )
        return NodeReading(target=ref.label, reach=reach)
    return NodeReading(
        target=ref.label, host=hello.host, run=hello.run_id, state=view.state, keeper=hello.keeper
    )


def read_nodes(refs: list[NodeRef], job: str | None) -> list[NodeReading]:
    """Every node at once; a node that cannot be read at all (no such run) raises RunError."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(refs)))) as pool:
        return list(pool.map(lambda r: read_node(r, job), refs))


def address_of(ref: NodeRef, reading: NodeReading) -> str | None:
    """Where a node's keeper is dialed: its socket here, or its ssh:// address with the run the
    remote end resolved."""
    if reading.run is None:
        return None
    if ref.remote is not None:
        return str(ref.remote.with_run(reading.run))
    return str(store.runs_dir() / reading.run / store.SOCKET_NAME)


class NodeFollower(threading.Thread):
    """One node, live: the snapshot, then its deltas folded into `reading.state` under `lock`;
    `on_change()` after each batch or change of link. Reconnects with backoff until stopped."""

    def __init__(
        self,
        ref: NodeRef,
        job: str | None,
        lock: threading.Lock,
        on_change: Callable[[], object],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name=f"trainroom-node-{ref.label}", daemon=True)
        self.ref, self.job, self.lock, self.on_change, self.clock = ref, job, lock, on_change, clock
        self.reading = NodeReading(target=ref.label)
        self.backoff = Backoff()
        self._stop = threading.Event()
        self._client: KeeperClient | None = None
        self.records = 0

    def stop(self) -> None:
        self._stop.set()
        c = self._client
        if c is not None:
            c.close()

    def run(self) -> None:
        while not self._stop.is_set():
            wait = self._once()
            if self._stop.wait(wait):
                return

    def _once(self) -> float:
        """One connection's life; the wait before the next."""
        try:
            if self.reading.run is None or self.reading.keeper != "alive":
                fresh = read_node(self.ref, self.job, self.clock)
                if not fresh.reach.reachable:
                    return self._lost(fresh.reach.error)
                with self.lock:
                    fresh.reach = self.reading.reach
                    fresh.reach.found()
                    self.reading = fresh
                self.on_change()
                if fresh.keeper != "alive":
                    return self.backoff.next_wait()  # its journal's state; look again later
            return self._follow()
        except KeeperUnreachable as exc:
            return self._lost(str(exc))
        except (KeeperGone, RunError, OSError) as exc:
            with self.lock:
                self.reading.keeper = "gone"
                self.reading.reach.error = str(exc)
            self.on_change()
            return self.backoff.next_wait()

    def _follow(self) -> float:
        address = address_of(self.ref, self.reading)
        if address is None:
            return self.backoff.next_wait()
        client = self._client = KeeperClient(address, timeout_s=20.0)
        view = client.subscribe_view(client="job")
        with self.lock:
            self.reading.state, self.reading.keeper = view.state, "alive"
            self.reading.reach.found()
        self.backoff.reset()
        self.on_change()
        state: RunState = view.state
        for batch in client.records():
            with self.lock:
                for rec in batch:
                    state.apply(rec)
            self.records += len(batch)
            self.on_change()
        return 0.0

    def _lost(self, why: str) -> float:
        wait = self.backoff.next_wait()
        with self.lock:
            self.reading.reach.lost(self.clock(), why, self.clock() + wait)
        self.on_change()
        return wait
