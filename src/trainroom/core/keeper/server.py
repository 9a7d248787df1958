"""The keeper's socket: trainers' reporters and clients on one Unix stream socket (0600, in a 0700
run dir; peers of another uid are refused by SO_PEERCRED).

A connection is a trainer after `Hello` (its frames become `Received` records) or a client after
`Subscribe` (a snapshot, then batched live deltas) or `Request` (an action, answered on the same
connection). A frame that is not a message closes that one connection, with the reason journaled;
a message with a bad field loses that field only (FIELD_REFUSED), and its connection stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

import msgspec

from trainroom.core.keeper.ports import Recorder
from trainroom.core.probes.procs import pid_alive
from trainroom.core.probes.runof import Unreadable, run_of_checked
from trainroom.core.wire import protocol as p
from trainroom.core.wire.salvage import RefusedField

CLIENT_BUFFER_LIMIT = 8 << 20  # a client this far behind is dropped; it can reconnect
READ_CHUNK = 1 << 16
# Limits against a careless or hostile peer of the same uid: how many connections at once, how
# many bytes all of them may hold half-read, how long a first message or a started frame may take.
MAX_CONNECTIONS = 256
# Past MAX_CONNECTIONS a newcomer first displaces the oldest connection that has not said what it
# is; one still admitted (up to ACTION_RESERVE more) may act, report or read a snapshot, never hold
# a live subscription: idle watchers never lock out a `kill`. One process holds at most
# MAX_LIVE_PER_PEER live subscriptions (what a control room or two need, not what a leak makes).
ACTION_RESERVE = 64
MAX_LIVE_PER_PEER = 16
BUFFER_BUDGET = 16 << 20
FIRST_MESSAGE_S = 10.0
PARTIAL_FRAME_S = 30.0
LISTEN_BACKLOG = 1024
# What a connection is, once its first message says: a trainer's reporter or a client.
PeerRole = Literal["trainer", "client"]
# Closed connections are journaled one by one up to this many per window, then counted.
CLOSE_RECORDS_PER_WINDOW = 5
CLOSE_WINDOW_S = 10.0


class ActionServer(Protocol):
    async def serve(self, req: p.Request, reply: Callable[[p.Reply], None], client: str) -> None: ...


class Host(Recorder, Protocol):
    """What the server needs of the keeper beyond recording."""

    @property
    def attempt_n(self) -> int: ...

    @property
    def run_id(self) -> str: ...

    def snapshot(self) -> p.Snapshot: ...


class RankClaim(msgspec.Struct, kw_only=True, frozen=True):
    """A second reporter that claimed a rank a live one already reports (refused)."""

    attempt: int
    rank: int
    owner_pid: int
    claimant_pid: int
    t: float


class FieldRefusal(msgspec.Struct, kw_only=True):
    """A field of a trainer's frames that was refused (out of range, the wrong type): the rest
    of each frame was kept (or, for a required field, the frame was dropped), the connection too.
    Counted per attempt, rank and field; what FIELD_REFUSED says."""

    attempt: int
    rank: int
    pid: int | None
    field: str
    value: str
    reason: str
    whole_frame: bool
    count: int = 1
    first_t: float
    last_t: float


MAX_FIELD_REFUSALS = 64


def not_of_attempt(pid: int, run_id: str, attempt: int) -> str | None:
    """Why `pid` may not report for this run's live attempt, or None when it may: a reporter is
    a process the attempt started (its environment, inherited by every child and torchrun worker,
    names the run and the attempt). Any other same-uid process that finds the socket, a
    straggler of an older attempt included, would otherwise hold a rank's step back for all
    to see (the run's step is the slowest rank's)."""
    found = run_of_checked(pid)
    if isinstance(found, Unreadable):
        return f"hello from pid {pid}: its environment cannot be read ({found.error})"
    if found.run != run_id:
        said = f"TRAINROOM_RUN={found.run}" if found.run else "no TRAINROOM_RUN"
        return f"hello from pid {pid}, not a process of run {run_id} ({said})"
    if found.attempt != attempt:
        of = found.attempt if found.attempt is not None else "?"
        return f"hello from pid {pid} of attempt {of}, the live attempt is {attempt}"
    return None


def _peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return int(pid), int(uid), int(gid)


class Conn:
    """One accepted connection: a trainer (after Hello) or a client (after Subscribe/Request)."""

    def __init__(self, writer: asyncio.StreamWriter, peer_pid: int | None) -> None:
        self.writer = writer
        self.peer_pid = peer_pid
        self.role: PeerRole | None = None
        self.rank = 0
        self.attempt = 0
        self.live = False
        self.pending: list[p.Record] = []
        self.name = "client"
        self.buffered = 0  # bytes of a frame read but not yet whole
        self.opened = time.monotonic()
        self.over_cap = False  # admitted past MAX_CONNECTIONS: no live subscription

    def send(self, msg: p.KeeperMsg) -> None:
        self.writer.write(p.frame(msg))


class Server:
    def __init__(self, host: Host, actions: ActionServer) -> None:
        self.host = host
        self.actions = actions
        self.conns: set[Conn] = set()
        self.uid = os.getuid()
        self._dirty = False
        self._server: asyncio.AbstractServer | None = None
        self._path: Path | None = None
        self._window_start = 0.0
        self._window_records = 0
        self._window_counted: dict[str, int] = {}
        # (attempt, rank) -> pid of the reporter connected for it; a second claimant is refused.
        self.rank_owners: dict[tuple[int, int], int] = {}
        self.rank_claims: list[RankClaim] = []
        self.refused_fields: dict[tuple[int, int, str], FieldRefusal] = {}
        # Told of each connection, message and close: a resting keeper wakes on it.
        self.changed: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ lifecycle

    async def listen(self, path: Path, before_publish: Callable[[], object]) -> None:
        """Bound and listening under a temporary name, then renamed into place: `launch` returns
        once the socket exists, and a client connecting between bind() and listen() on a loaded
        machine would be refused. `before_publish` runs just before the rename."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        bind_path = path.with_name(".bind.sock")
        with contextlib.suppress(FileNotFoundError):
            bind_path.unlink()
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self.handle, path=str(bind_path), limit=1 << 20, backlog=LISTEN_BACKLOG
            )
        finally:
            os.umask(old_umask)
        os.chmod(bind_path, 0o600)
        before_publish()
        os.replace(bind_path, path)
        self._path = path

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            self._close(c, None)
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()

    def has_clients(self) -> bool:
        return any(c.role == "client" for c in self.conns)

    def has_viewers(self) -> bool:
        """A live subscription is open (a control room, `events --follow`)."""
        return any(c.live for c in self.conns)

    # ------------------------------------------------------------------ live deltas

    def queue(self, rec: p.Record) -> None:
        for c in self.conns:
            if c.live:
                c.pending.append(rec)
        self._dirty = True

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        for c in list(self.conns):
            if not c.pending:
                continue
            batch, c.pending = c.pending, []
            transport = c.writer.transport
            if transport.get_write_buffer_size() > CLIENT_BUFFER_LIMIT:
                self._close(c, "client too slow: over 8 MiB behind")
                continue
            try:
                c.send(p.Delta(records=batch))
            except Exception as exc:
                self._close(c, f"send failed: {exc}")

    # ------------------------------------------------------------------ connections

    def _close(self, c: Conn, reason: str | None) -> None:
        self.changed()
        if c in self.conns:
            self.conns.discard(c)
            if reason:
                self._record_close(c, reason)
        with contextlib.suppress(Exception):
            c.writer.close()
        if c.role == "trainer":
            if self.rank_owners.get((c.attempt, c.rank)) == c.peer_pid:
                del self.rank_owners[(c.attempt, c.rank)]
            self.host.emit(p.TrainerDisconnected(attempt=c.attempt, rank=c.rank, t=time.time()))

    def _record_close(self, c: Conn, reason: str) -> None:
        """Journal why a connection was closed, at a bounded rate: a flood of garbage connections
        becomes a count, not a record each."""
        now = time.time()
        if now - self._window_start >= CLOSE_WINDOW_S:
            self._flush_close_counts(now)
        if self._window_records < CLOSE_RECORDS_PER_WINDOW:
            self._window_records += 1
            self.host.emit(p.ConnectionClosed(t=now, peer_pid=c.peer_pid, reason=reason))
            return
        kind = reason.split(":", 1)[0]
        self._window_counted[kind] = self._window_counted.get(kind, 0) + 1

    def _flush_close_counts(self, now: float) -> None:
        if self._window_counted:
            total = sum(self._window_counted.values())
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(self._window_counted.items()))
            self.host.emit(
                p.KeeperNote(
                    t=now,
                    kind="warning",
                    message=f"closed {total} more connection(s) in {CLOSE_WINDOW_S:.0f} s: {kinds}",
                )
            )
        self._window_start, self._window_records, self._window_counted = now, 0, {}

    def tick(self, now: float) -> None:
        """Called by the keeper's tick: a count of closes is journaled once its window ends."""
        if self._window_counted and now - self._window_start >= CLOSE_WINDOW_S:
            self._flush_close_counts(now)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer_pid: int | None = None
        try:
            peer_pid, peer_uid, _ = _peer_cred(sock)
        except OSError:
            peer_uid = -1
        c = Conn(writer, peer_pid)
        self.conns.add(c)
        self.changed()
        if peer_uid != self.uid:
            self._close(c, f"refused peer pid {peer_pid}: uid {peer_uid} is not the keeper's uid {self.uid}")
            return
        if len(self.conns) > MAX_CONNECTIONS:
            self._displace_silent()
        if len(self.conns) > MAX_CONNECTIONS + ACTION_RESERVE:
            self._close(c, f"refused peer pid {peer_pid}: {len(self.conns) - 1} connections already open")
            return
        c.over_cap = len(self.conns) > MAX_CONNECTIONS
        self._close(c, await self._read(c, reader))

    def _displace_silent(self) -> None:
        """Close the oldest connection that has sent nothing yet, of the peer holding the most:
        a client that means something speaks at once."""
        silent = [x for x in self.conns if x.role is None and x.buffered == 0]
        if not silent:
            return
        per_peer: dict[int | None, int] = {}
        for x in self.conns:
            per_peer[x.peer_pid] = per_peer.get(x.peer_pid, 0) + 1
        oldest = min(silent, key=lambda x: (-per_peer[x.peer_pid], x.opened))
        self._close(
            oldest, f"displaced pid {oldest.peer_pid}: silent while {len(self.conns)} connections were open"
        )

    def _live_refusal(self, c: Conn) -> str | None:
        """Why this connection may not hold a live subscription, or None when it may."""
        if c.over_cap:
            return f"refused subscription from pid {c.peer_pid}: {MAX_CONNECTIONS} connections open (actions still served)"
        mine = sum(1 for x in self.conns if x.live and x.peer_pid == c.peer_pid)
        if c.peer_pid is not None and mine >= MAX_LIVE_PER_PEER:
            return f"refused subscription from pid {c.peer_pid}: it holds {mine} live subscriptions already"
        return None

    async def _read(self, c: Conn, reader: asyncio.StreamReader) -> str | None:
        """Read and handle frames until the peer leaves (None) or must be dropped (why)."""
        frames = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME, salvage_as=p.InboundMsg)
        who = f"pid {c.peer_pid}"
        try:
            while True:
                timeout = FIRST_MESSAGE_S if c.role is None else PARTIAL_FRAME_S if c.buffered else None
                try:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), timeout)
                except TimeoutError:
                    what = "no first message" if c.role is None else "a frame left half-sent"
                    return f"timeout from {who}: {what} within {timeout:.0f} s"
                if not data:
                    return None  # a trainer that went away: its attempt's exit says why
                try:
                    msgs = frames.feed(data)
                except p.ProtocolError as exc:
                    for msg in exc.decoded:  # whole frames before the bad one still count
                        await self._on_message(c, msg)
                    raise
                c.buffered = frames.buffered
                for msg in msgs:
                    await self._on_message(c, msg)
                if frames.refused:
                    self._note_refused(c, frames.refused)
                    frames.refused = []
                if sum(x.buffered for x in self.conns) > BUFFER_BUDGET:
                    return (
                        f"over budget from {who}: {BUFFER_BUDGET >> 20} MiB held half-read across connections"
                    )
        except p.ProtocolError as exc:
            return f"protocol error from {who}: {exc}"
        except OSError:
            return None
        except Exception as exc:
            return f"internal error on connection from {who}: {type(exc).__name__}: {exc}"

    def _note_refused(self, c: Conn, refused: list[RefusedField]) -> None:
        """Count the fields refused on this connection (a reporter that sends `tokens=-1` with
        every step is one entry with a count, not a record per frame)."""
        now = time.time()
        attempt = c.attempt if c.role == "trainer" else self.host.attempt_n
        for r in refused:
            key = (attempt, c.rank, r.field)
            seen = self.refused_fields.get(key)
            if seen is not None:
                seen.count += 1
                seen.last_t, seen.value, seen.whole_frame = now, r.value, r.whole_frame
                continue
            if len(self.refused_fields) >= MAX_FIELD_REFUSALS:
                del self.refused_fields[next(iter(self.refused_fields))]
            self.refused_fields[key] = FieldRefusal(
                attempt=attempt,
                rank=c.rank,
                pid=c.peer_pid,
                field=r.field,
                value=r.value,
                reason=r.reason,
                whole_frame=r.whole_frame,
                first_t=now,
                last_t=now,
            )

    async def _on_message(self, c: Conn, msg: p.InboundMsg) -> None:
        self.changed()
        if c.role is None and not await self._first_message(c, msg):
            return
        if c.role == "trainer":
            if isinstance(msg, (p.Subscribe, p.Request)):
                raise p.ProtocolError("a trainer connection sent a client message")
            self.host.emit(p.Received(attempt=c.attempt, rank=c.rank, t=time.time(), msg=p.bounded(msg)))
        elif isinstance(msg, p.Request):
            asyncio.get_running_loop().create_task(self._serve_request(c, msg))
        elif not isinstance(msg, p.Subscribe):
            raise p.ProtocolError(f"a client connection sent {type(msg).__name__}")

    async def _first_message(self, c: Conn, msg: p.InboundMsg) -> bool:
        """Take the connection's role from its first message; False when it is already done."""
        if isinstance(msg, p.Hello):
            self._take_rank(c, msg)
            return True
        if isinstance(msg, p.Subscribe):
            refused = self._live_refusal(c) if msg.live else None
            if refused:
                self._close(c, refused)
                return False
            c.role, c.name = "client", msg.client
            c.send(self.host.snapshot())
            if msg.live:
                c.live = True
            else:
                await c.writer.drain()
                self._close(c, None)
            return False
        if isinstance(msg, p.Request):
            c.role = "client"
            return True
        raise p.ProtocolError(f"first message was {type(msg).__name__}, not hello/subscribe/request")

    def _take_rank(self, c: Conn, msg: p.Hello) -> None:
        """A reporter says who it is: the pid it claims must be the peer the kernel names
        (SO_PEERCRED), and a rank already held by a live reporter of this attempt is not taken
        over: the newcomer is refused and RANK_CLAIMED says who tried."""
        if msg.v != p.PROTOCOL_VERSION:
            raise p.ProtocolError(f"protocol version {msg.v}, keeper speaks {p.PROTOCOL_VERSION}")
        if c.peer_pid is not None and msg.pid != c.peer_pid:
            raise p.ProtocolError(f"hello claims pid {msg.pid}, but the peer is pid {c.peer_pid}")
        attempt = self.host.attempt_n
        if c.peer_pid is not None:
            why = not_of_attempt(c.peer_pid, self.host.run_id, attempt)
            if why:
                raise p.ProtocolError(why)
        owner = self.rank_owners.get((attempt, msg.rank))
        if owner is not None and owner != msg.pid and pid_alive(owner):
            self.rank_claims.append(
                RankClaim(
                    attempt=attempt, rank=msg.rank, owner_pid=owner, claimant_pid=msg.pid, t=time.time()
                )
            )
            del self.rank_claims[:-16]
            raise p.ProtocolError(f"rank {msg.rank} of attempt {attempt} is already reported by pid {owner}")
        self.rank_owners[(attempt, msg.rank)] = msg.pid
        c.role, c.rank, c.attempt = "trainer", msg.rank, attempt

    async def _serve_request(self, c: Conn, req: p.Request) -> None:
        def reply(r: p.Reply) -> None:
            with contextlib.suppress(Exception):
                c.send(r)

        try:
            await self.actions.serve(req, reply, c.name)
        except Exception as exc:
            reply(
                p.Reply(
                    id=req.id,
                    action=req.action,
                    stage="done",
                    ok=False,
                    message=f"{req.action} failed: {type(exc).__name__}: {exc}",
                )
            )
        with contextlib.suppress(Exception):
            await c.writer.drain()
