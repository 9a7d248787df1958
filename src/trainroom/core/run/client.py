"""A blocking client of a keeper: what `status`, scripts and the control room's reader use."""

from __future__ import annotations

import contextlib
import itertools
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from trainroom.core.probes.procs import process_state
from trainroom.core.run import store, summary
from trainroom.core.run.address import is_remote
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.core.run.view import RunView
from trainroom.core.vocab import KeeperWord
from trainroom.core.wire import protocol as p


class KeeperGone(Exception):
    """The keeper is not there (no socket, refused) or went away mid-stream."""


class KeeperBusy(KeeperGone):
    """The keeper's process lives but its socket did not take the connection in time (its
    listen backlog is full, or it is stopped): not gone."""


class KeeperUnreachable(KeeperGone):
    """A remote keeper's host did not answer, or the ssh link dropped: unreachable since then,
    never a verdict on the run."""


class Dialer(Protocol):
    """Keepers on other hosts: `dial` gives a socket to one and what its host says of its keeper
    (raising KeeperUnreachable when the host is not reached, KeeperGone when it refuses);
    `dropped` tells a link that dropped from a keeper that closed."""

    def dial(self, address: str) -> tuple[socket.socket, KeeperWord]: ...

    def dropped(self, sock: socket.socket) -> bool: ...


# Installed by the remote package (`remote.reach.install`) in the processes that reach other hosts.
DIALER: Dialer | None = None


class KeeperClient:
    _ids = itertools.count(1)

    def __init__(self, sock_path: str, timeout_s: float | None = 5.0) -> None:
        self.sock_path = sock_path
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._reader = p.FrameReader(p.keeper_decoder, p.MAX_OUTBOUND_FRAME)
        self._ready: list[Any] = []
        # What the remote host said of its keeper when this client last dialed it (remote only).
        self.remote_keeper: KeeperWord | None = None

    def _connect(self) -> socket.socket:
        if is_remote(self.sock_path):
            return self._dial()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        try:
            s.connect(self.sock_path)
        except (TimeoutError, BlockingIOError) as exc:
            s.close()
            raise KeeperBusy(
                f"keeper at {self.sock_path} did not answer: {exc.strerror or 'timed out'}"
            ) from None
        except PermissionError:
            s.close()
            raise KeeperGone(
                f"keeper at {self.sock_path} is not yours: its socket is readable by its own user only"
            ) from None
        except OSError as exc:
            s.close()
            raise KeeperGone(f"keeper not reachable at {self.sock_path}: {exc.strerror or exc}") from None
        return s

    def _dial(self) -> socket.socket:
        """A keeper on another host, through the installed dialer (`ssh HOST trainroom bridge RUN`,
        whose stdio is our socket)."""
        if DIALER is None:
            raise KeeperGone(
                f"{self.sock_path}: a keeper on another host is reached through trainroom's command line"
            )
        sock, self.remote_keeper = DIALER.dial(self.sock_path)
        sock.settimeout(self.timeout_s)
        return sock

    def _recv(self, sock: socket.socket) -> Any:
        while not self._ready:
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                raise
            except OSError as exc:
                raise self._lost(sock, f"keeper connection lost: {exc}") from None
            if not data:
                raise self._lost(sock, "keeper closed the connection")
            try:
                self._ready.extend(self._reader.feed(data))
            except p.ProtocolError as exc:
                raise KeeperGone(f"keeper sent what this client cannot read: {exc}") from None
        return self._ready.pop(0)

    def _lost(self, sock: socket.socket, why: str) -> KeeperGone:
        """A remote link that drops is unreachable, not gone: the keeper may live on behind it
        (ssh's exit says which: the bridge ends cleanly when the keeper closed)."""
        if DIALER is not None and DIALER.dropped(sock):
            return KeeperUnreachable(f"{self.sock_path}: link lost ({why})")
        return KeeperGone(why)

    def subscribe(self, client: str = "client", live: bool = True) -> RunState:
        return self.subscribe_view(client, live).state

    def subscribe_view(self, client: str = "client", live: bool = True) -> RunView:
        """The snapshot as a RunView (state and plot series); `records()` then yields what to
        fold into it."""
        self.close()
        self._reader = p.FrameReader(p.keeper_decoder, p.MAX_OUTBOUND_FRAME)
        self._ready = []
        self._sock = self._connect()
        try:
            self._sock.sendall(p.frame(p.Subscribe(client=client, live=live)))
            msg = self._recv(self._sock)
        except TimeoutError:
            raise KeeperBusy(
                f"keeper at {self.sock_path} sent no snapshot within {self.timeout_s} s"
            ) from None
        if not isinstance(msg, p.Snapshot):
            raise KeeperGone(f"expected a snapshot, got {type(msg).__name__}")
        return RunView.from_snapshot(msg)

    def records(self, timeout_s: float | None = None) -> Iterator[list[Any]]:
        """Live deltas until the keeper goes away (KeeperGone) or a receive times out."""
        assert self._sock is not None, "subscribe() first"
        self._sock.settimeout(timeout_s)
        while True:
            msg = self._recv(self._sock)
            if isinstance(msg, p.Delta):
                yield msg.records

    def request(
        self,
        action: str,
        args: dict[str, Any] | None = None,
        confirm: bool = False,
        timeout_s: float | None = 600.0,
    ) -> Iterator[p.Reply]:
        """Send an action request on its own connection; yield replies until the `done` one."""
        sock = self._connect()
        sock.settimeout(timeout_s)
        reader = p.FrameReader(p.keeper_decoder, p.MAX_OUTBOUND_FRAME)
        rid = next(self._ids)
        try:
            sock.sendall(p.frame(p.Request(id=rid, action=action, args=args or {}, confirm=confirm)))
            while True:
                data = sock.recv(1 << 20)
                if not data:
                    raise self._lost(sock, "keeper closed the connection before answering")
                for msg in reader.feed(data):
                    if isinstance(msg, p.Reply) and msg.id == rid:
                        yield msg
                        if msg.stage == "done" or (msg.stage == "plan" and not confirm):
                            return
        except (ConnectionError, p.ProtocolError) as exc:
            # A keeper that answers only its own uid resets a stranger's connection.
            raise KeeperGone(f"keeper refused or dropped the request: {exc}") from None
        finally:
            sock.close()

    def call(
        self,
        action: str,
        args: dict[str, Any] | None = None,
        confirm: bool = False,
        timeout_s: float | None = 600.0,
    ) -> p.Reply:
        last: p.Reply | None = None
        for r in self.request(action, args, confirm, timeout_s):
            last = r
        if last is None:
            raise KeeperGone("no reply")
        return last

    def confirmed(
        self, action: str, args: dict[str, Any] | None = None, timeout_s: float | None = 600.0
    ) -> p.Reply:
        """Plan, then carry out exactly that plan (for scripts that have already decided, like
        `--yes`): the refusal when there is nothing to confirm, else the `done` reply."""
        plan = self.call(action, args, confirm=False, timeout_s=timeout_s)
        if plan.stage != "plan":
            return plan
        return self.call(action, p.confirming(args or {}, plan.plan), confirm=True, timeout_s=timeout_s)

    def close(self) -> None:
        """Shut the socket down before closing it: on Linux a close() alone does not wake a
        recv() blocked in another thread (the control room's reader)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def snapshot(sock_path: str, timeout_s: float = 5.0) -> RunState:
    c = KeeperClient(sock_path, timeout_s)
    try:
        return c.subscribe(client="status", live=False)
    finally:
        c.close()


BUSY_TRIES = (1.0, 2.0, 4.0)  # connect timeouts for a keeper that lives but does not answer


def keeper_stopped(info: RunInfo) -> int | None:
    """The keeper's pid when its process is stopped (SIGSTOP, a debugger's trace stop): it can
    take no connection until continued, so waiting on it only delays what the journal says."""
    try:
        pid = store.read_record(Path(info.run_dir)).keeper_pid
    except store.RunError:
        return None
    return pid if pid is not None and process_state(pid) in ("T", "t") else None


def read_run(info: RunInfo) -> tuple[RunState, KeeperWord]:
    """The run from its keeper; from its journal when the keeper is gone ("gone": its process is
    gone, by pid and start time) or keeps not answering ("busy": it lives; retried with backoff
    first, never called gone). A remote run's bridge does the same on its host."""
    if info.remote is not None:
        c = KeeperClient(info.sock, timeout_s=None)
        try:
            state = c.subscribe(client="status", live=False)
        finally:
            c.close()
        return state, c.remote_keeper or "gone"
    if info.alive and keeper_stopped(info):
        return store.load_state(info.run_dir), "busy"  # a stopped process answers nobody: no tries
    if info.alive:
        for timeout in BUSY_TRIES:
            try:
                return snapshot(info.sock, timeout_s=timeout), "alive"
            except KeeperBusy:
                continue
            except KeeperGone:
                break
        else:
            return store.load_state(info.run_dir), "busy"
    rec = store.read_record(Path(info.run_dir))
    keeper: KeeperWord = "busy" if info.alive and store.keeper_alive(rec) else "gone"
    return store.load_state(info.run_dir), keeper


def current_state(info: RunInfo) -> tuple[RunState, bool]:
    """The run from its keeper, or from its journal when the keeper is gone; and whether the
    keeper lives (it may be busy: then the state is the journal's)."""
    state, keeper = read_run(info)
    return state, keeper != "gone"


SummarySource = Literal["keeper", "summary", "journal"]


def read_summary(info: RunInfo) -> tuple[RunSummary, KeeperWord, SummarySource]:
    """The run in one line: from its keeper while it lives, else from the summary file its keeper
    left when that still matches the journal (one stat), else from the snapshot and the journal
    after it."""
    if info.alive:
        st, keeper = read_run(info)
        return summary.summarize(st), keeper, "keeper" if keeper == "alive" else "journal"
    d = Path(info.run_dir)
    s = summary.read(d)
    if s is not None and summary.fresh(s, d / store.JOURNAL_NAME):
        return s, "gone", "summary"
    return summary.summarize(store.load_state(d)), "gone", "journal"
