"""The bridge's relay: bytes both ways between stdio (ssh's channel) and the keeper's socket
until either side closes. The frames are the keeper protocol's, untouched: the keeper checks them
as it checks a local client's (its bounds, SO_PEERCRED: the bridge runs as the keeper's user)."""

from __future__ import annotations

import os
import selectors
import socket

CHUNK = 1 << 16


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def relay(in_fd: int, out_fd: int, sock: socket.socket, first: bytes = b"") -> str:
    """Relay until one side closes; return which one and how ("client closed", "keeper closed",
    or the error). `first`: bytes already read from `in_fd` that belong to the keeper."""
    sock.setblocking(True)
    sock.settimeout(None)
    if first:
        sock.sendall(first)
    sel = selectors.DefaultSelector()
    sel.register(in_fd, selectors.EVENT_READ, "client")
    sel.register(sock, selectors.EVENT_READ, "keeper")
    try:
        while True:
            for key, _ in sel.select():
                try:
                    if key.data == "client":
                        data = os.read(in_fd, CHUNK)
                        if not data:
                            return "client closed"
                        sock.sendall(data)
                    else:
                        data = sock.recv(CHUNK)
                        if not data:
                            return "keeper closed"
                        write_all(out_fd, data)
                except OSError as exc:
                    return f"{key.data} link failed: {exc.strerror or exc}"
    finally:
        sel.close()
