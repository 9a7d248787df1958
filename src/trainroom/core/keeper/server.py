"""The keeper's socket: trainers' reporters and clients on one Unix stream socket (0600, in a 0700
run dir; peers of another uid are refused by SO_PEERCRED).

A connection is a trainer after `Hello` (its frames become `Received` records) or a client after
`Subscribe` (a snapshot, then batched live deltas) or `Request` (an action, answered on the same
connection). A bad frame closes that one connection, with the reason journaled.
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

from trainroom.core import protocol as p
from trainroom.core.keeper.ports import Recorder

CLIENT_BUFFER_LIMIT = 8 << 20  # a client this far behind is dropped; it can reconnect
READ_CHUNK = 1 << 16


class ActionServer(Protocol):
    async def serve(self, req: p.Request, reply: Callable[[p.Reply], None], client: str) -> None: ...


class Host(Recorder, Protocol):
    """What the server needs of the keeper beyond recording."""

    @property
    def attempt_n(self) -> int: ...

    def snapshot(self) -> p.Snapshot: ...


def _peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return int(pid), int(uid), int(gid)


class Conn:
    """One accepted connection: a trainer (after Hello) or a client (after Subscribe/Request)."""

    def __init__(self, writer: asyncio.StreamWriter, peer_pid: int | None) -> None:
        self.writer = writer
        self.peer_pid = peer_pid
        self.role: Literal["trainer", "client"] | None = None
        self.rank = 0
        self.attempt = 0
        self.live = False
        self.pending: list[p.Record] = []
        self.name = "client"

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
            self._server = await asyncio.start_unix_server(self.handle, path=str(bind_path), limit=1 << 20)
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
        if c in self.conns:
            self.conns.discard(c)
            if reason:
                self.host.emit(p.ConnectionClosed(t=time.time(), peer_pid=c.peer_pid, reason=reason))
        with contextlib.suppress(Exception):
            c.writer.close()
        if c.role == "trainer":
            self.host.emit(p.TrainerDisconnected(attempt=c.attempt, rank=c.rank, t=time.time()))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer_pid: int | None = None
        try:
            peer_pid, peer_uid, _ = _peer_cred(sock)
        except OSError:
            peer_uid = -1
        c = Conn(writer, peer_pid)
        self.conns.add(c)
        if peer_uid != self.uid:
            self._close(c, f"refused peer pid {peer_pid}: uid {peer_uid} is not the keeper's uid {self.uid}")
            return
        frames = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
        reason: str | None = None
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break  # a trainer that went away: its attempt's exit says why
                for msg in frames.feed(data):
                    await self._on_message(c, msg)
        except p.ProtocolError as exc:
            reason = f"protocol error from pid {peer_pid}: {exc}"
        except OSError:
            reason = None
        except Exception as exc:
            reason = f"internal error on connection from pid {peer_pid}: {type(exc).__name__}: {exc}"
        self._close(c, reason)

    async def _on_message(self, c: Conn, msg: p.InboundMsg) -> None:
        if c.role is None and not await self._first_message(c, msg):
            return
        if c.role == "trainer":
            if isinstance(msg, (p.Subscribe, p.Request)):
                raise p.ProtocolError("a trainer connection sent a client message")
            self.host.emit(p.Received(attempt=c.attempt, rank=c.rank, t=time.time(), msg=msg))
        elif isinstance(msg, p.Request):
            asyncio.get_running_loop().create_task(self._serve_request(c, msg))
        elif not isinstance(msg, p.Subscribe):
            raise p.ProtocolError(f"a client connection sent {type(msg).__name__}")

    async def _first_message(self, c: Conn, msg: p.InboundMsg) -> bool:
        """Take the connection's role from its first message; False when it is already done."""
        if isinstance(msg, p.Hello):
            if msg.v != p.PROTOCOL_VERSION:
                raise p.ProtocolError(f"protocol version {msg.v}, keeper speaks {p.PROTOCOL_VERSION}")
            c.role, c.rank, c.attempt = "trainer", msg.rank, self.host.attempt_n
            return True
        if isinstance(msg, p.Subscribe):
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
