"""A real HTTP receiver on 127.0.0.1 for the alert tests: it records every POST (path, headers,
body, arrival time) and answers 200, answers 500, hangs until the test releases it, or drips a
200 answer one byte every DRIP_S (a slow-loris receiver: every read succeeds, the answer never
ends in time) until the test releases it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import msgspec

Mode = Literal["ok", "fail", "hang", "drip"]
DRIP_S = 0.5
DRIP_BYTES = 600
HANG_LIMIT_S = 300.0  # a hanging answer is released by the test, or by this, never left behind


class Received(msgspec.Struct, kw_only=True):
    t: float
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, mode: Mode = "ok") -> None:
        self.mode = mode
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._got: list[Received] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with owner._lock:
                    owner._got.append(
                        Received(t=time.time(), path=self.path, headers=dict(self.headers.items()), body=body)
                    )
                if owner.mode == "hang":
                    owner.release.wait(HANG_LIMIT_S)
                if owner.mode == "drip":
                    self.send_response(200)
                    self.send_header("Content-Length", str(DRIP_BYTES))
                    self.end_headers()
                    for _ in range(DRIP_BYTES):
                        if owner.release.wait(DRIP_S):
                            return
                        try:
                            self.wfile.write(b".")
                            self.wfile.flush()
                        except OSError:
                            return
                    return
                code = 500 if owner.mode == "fail" else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def got(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._got if path is None or r.path == path]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiver(mode: Mode = "ok") -> Iterator[Receiver]:
    r = Receiver(mode)
    try:
        yield r
    finally:
        r.close()
