"""The channels an alert goes out through: a webhook (trainroom's JSON or Slack's), an ntfy-style
POST, a command hook and notify-send. Each `send` makes one try, blocking (a worker thread calls
it, never the keeper's loop), and returns a short detail or raises DeliveryError.

Targets are secrets. A channel is known by a redacted name (`units.redact_url`), and every error
text it raises has the target's secret parts scrubbed, so neither the journal, `status` nor a
log line can carry one.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from trainroom.core.configuration import sections
from trainroom.core.notify import alert as shapes
from trainroom.core.notify.alert import Alert
from trainroom.core.units import fmt_duration, redact_command, redact_url

READ_LIMIT = 1 << 16  # of a receiver's answer: it is read (a clean close) but not kept
DETAIL_LIMIT = 200


class DeliveryError(Exception):
    """One try failed; str() is one line, already scrubbed of the target's secrets."""


class Channel(Protocol):
    @property
    def name(self) -> str:
        """`webhook https://hooks.example/…#1a2b`: what results and `status` show."""

    def send(self, alert: Alert, timeout_s: float) -> str:
        """One try; the receiver's answer in a few words (HTTP 200, exit 0)."""


class _Scrub:
    """Removes a target's secret parts from a text (error messages may quote a URL or argv)."""

    def __init__(self, secrets: list[str]) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "…")
        text = " ".join(text.split())
        return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"


def _url_secrets(url: str) -> list[str]:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return [url, path, parts.path, parts.query, parts.password or "", unquote(parts.path)]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A POST is never replayed elsewhere: a redirect is reported as the answer it is."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect())


class HttpChannel:
    """A POST of one alert shape to one URL."""

    def __init__(self, kind: str, url: str, shape: Callable[[Alert], tuple[bytes, dict[str, str]]]) -> None:
        self.kind = kind
        self._url, self._auth = _split_userinfo(url)
        self._shape = shape
        self._scrub = _Scrub(_url_secrets(url))
        self._name = f"{kind} {redact_url(url)}"

    @property
    def name(self) -> str:
        return self._name

    def send(self, alert: Alert, timeout_s: float) -> str:
        """One POST, answered in full within `timeout_s` overall (not per read: a receiver that
        drips one byte every few seconds is cut off at the deadline)."""
        body, headers = self._shape(alert)
        headers = {"User-Agent": "trainroom", **headers}
        if self._auth:
            headers["Authorization"] = self._auth
        req = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        cut = _Deadline()
        timer = threading.Timer(timeout_s, cut.fire)
        timer.daemon = True
        timer.start()
        try:
            with cut.opener().open(req, timeout=timeout_s) as resp:
                resp.read(READ_LIMIT)
                status = resp.status
        except urllib.error.HTTPError as exc:
            raise DeliveryError(self._scrub(f"HTTP {exc.code} {exc.reason}")) from None
        except TimeoutError:
            raise DeliveryError(f"no answer within {fmt_duration(timeout_s)}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError) or cut.fired:
                raise DeliveryError(cut.words(timeout_s)) from None
            raise DeliveryError(self._scrub(f"cannot reach the receiver: {reason}")) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cut.fired:
                raise DeliveryError(cut.words(timeout_s)) from None
            raise DeliveryError(self._scrub(f"{type(exc).__name__}: {exc}")) from None
        finally:
            timer.cancel()
        if cut.fired:
            raise DeliveryError(cut.words(timeout_s))
        return f"HTTP {status}"


class _Deadline:
    """An overall deadline for one HTTP try: the sockets its opener connects are remembered (urllib
    drops the connection's reference once the headers are in, the answer still reads from the
    socket), and at the deadline they are shut down, which ends whatever read is blocked on them."""

    def __init__(self) -> None:
        self.fired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _connected(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._socks.append(sock)
            late = self.fired
        if late:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def words(self, timeout_s: float) -> str:
        return f"no complete answer within {fmt_duration(timeout_s)}: cut off (the receiver is too slow)"

    def opener(self) -> urllib.request.OpenerDirector:
        seen = self._connected

        class Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                seen(self.sock)

        class Conns(http.client.HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                seen(self.sock)

        class Http(urllib.request.HTTPHandler):
            def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
                return self.do_open(Conn, req)

        class Https(urllib.request.HTTPSHandler):
            def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
                return self.do_open(Conns, req, context=getattr(self, "_context", None))

        return urllib.request.build_opener(_NoRedirect(), Http(), Https())


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """`https://user:token@host/...` as the URL without its user part and a Basic header
    (urllib does not take credentials from the URL itself; ntfy's access tokens work so)."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    creds = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, "Basic " + base64.b64encode(creds.encode()).decode()


def _json_shape(alert: Alert) -> tuple[bytes, dict[str, str]]:
    return shapes.json_body(alert), {"Content-Type": "application/json"}


def _slack_shape(alert: Alert) -> tuple[bytes, dict[str, str]]:
    return shapes.slack_body(alert), {"Content-Type": "application/json"}


def run_hook(
    argv: list[str], *, stdin: bytes, env: Mapping[str, str], cwd: str | None, timeout_s: float
) -> int:
    """Run a command to its end or its timeout (then its whole process group is killed); its
    exit code. Its output is not kept: a hook talks to its own receiver, not to the journal."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode


class CommandChannel:
    """A command hook: the alert in TRAINROOM_ALERT_* variables and as JSON on stdin; exit 0 is
    delivered. Split like a shell would, run without one, in the run's project dir."""

    def __init__(self, command: str, *, cwd: str | None, env: Mapping[str, str]) -> None:
        self._argv = shlex.split(command)
        self._cwd = cwd
        self._env = dict(env)
        self._scrub = _Scrub([command, *self._argv[1:]])
        self._name = f"command {redact_command(command)}"

    @property
    def name(self) -> str:
        return self._name

    def send(self, alert: Alert, timeout_s: float) -> str:
        env = {**self._env, **shapes.environment(alert)}
        try:
            rc = run_hook(
                self._argv, stdin=shapes.json_body(alert), env=env, cwd=self._cwd, timeout_s=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"still running after {fmt_duration(timeout_s)}: killed") from None
        except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument or the environment
            raise DeliveryError(
                self._scrub(
                    f"cannot run {os.path.basename(self._argv[0])}: {getattr(exc, 'strerror', None) or exc}"
                )
            ) from None
        if rc != 0:
            raise DeliveryError(f"exit {rc}" if rc > 0 else f"killed by signal {-rc}")
        return "exit 0"


class DesktopChannel:
    """notify-send on the session bus the keeper was started under."""

    name = "desktop notify-send"

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = dict(env)

    def send(self, alert: Alert, timeout_s: float) -> str:
        try:
            rc = run_hook(shapes.desktop_argv(alert), stdin=b"", env=self._env, cwd=None, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            raise DeliveryError(
                f"notify-send still running after {fmt_duration(timeout_s)}: killed"
            ) from None
        except OSError as exc:
            raise DeliveryError(f"cannot run notify-send: {exc.strerror or exc}") from None
        if rc != 0:
            raise DeliveryError(f"notify-send exit {rc}")
        return "exit 0"


def desktop_unavailable(env: Mapping[str, str]) -> str | None:
    """Why notify-send cannot show anything here, or None."""
    if not env.get("DBUS_SESSION_BUS_ADDRESS"):
        return "no session bus (DBUS_SESSION_BUS_ADDRESS is not set where the keeper runs)"
    if shutil.which("notify-send", path=env.get("PATH")) is None:
        return "notify-send is not installed (Debian/Ubuntu: libnotify-bin)"
    return None


def channels_from(
    n: sections.Notify, *, cwd: str | None, env: Mapping[str, str]
) -> tuple[list[Channel], list[tuple[str, str]]]:
    """The channels [notify] names, and (name, why) for each that cannot work here."""
    out: list[Channel] = []
    out += [HttpChannel("webhook", u, _json_shape) for u in sections.as_list(n.webhook)]
    out += [HttpChannel("slack", u, _slack_shape) for u in sections.as_list(n.slack)]
    out += [HttpChannel("ntfy", u, shapes.ntfy_request) for u in sections.as_list(n.ntfy)]
    out += [CommandChannel(c, cwd=cwd, env=env) for c in sections.as_list(n.command)]
    unavailable: list[tuple[str, str]] = []
    if n.desktop:
        why = desktop_unavailable(env)
        if why is None:
            out.append(DesktopChannel(env))
        else:
            unavailable.append((DesktopChannel.name, why))
    return out, unavailable
