"""The keeper: owns one run, outlives the shell that launched it, and is its one source of truth.

It runs in its own session (the launcher setsid()s it), starts each attempt of the trainer as its
child in a new process group with stdin on /dev/null and stdout+stderr appended to trainer.log,
waits on it (so the exit code or signal is known the moment it dies), takes telemetry frames from
the trainer's reporter, probes the host each second, runs the watchdog, journals everything that
matters and serves any number of clients: a snapshot on connect, then live deltas.

It imports neither torch nor textual: verification and the bench run in short-lived subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from trainroom.core import protocol as p
from trainroom.core.findings import Finding
from trainroom.core.probes import procs
from trainroom.core.run import store as runs
from trainroom.core.run.journal import Journal
from trainroom.core.run.state import RunState, to_snapshot
from trainroom.core.samples import HostSample

TICK_S = 0.1  # watchdog cadence: DEAD is raised by the child's exit, the rest within a tick
PROBE_S = 1.0
DELTA_S = 0.05  # live records are batched into one Delta frame per client at most this often
CLIENT_BUFFER_LIMIT = 8 << 20  # a client this far behind is dropped; it can reconnect
DEFAULT_LINGER_S = 3600.0
FINDING_REJOURNAL_S = 10.0

NANOGPT_PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[-+0-9.eE]+|nan|inf)"


def _peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)


class Conn:
    """One accepted connection: a trainer (after Hello) or a client (after Subscribe/Request)."""

    def __init__(self, writer: asyncio.StreamWriter, peer_pid: int | None) -> None:
        self.writer = writer
        self.peer_pid = peer_pid
        self.role: str | None = None
        self.rank = 0
        self.attempt = 0
        self.live = False
        self.pending: list[Any] = []
        self.name = "client"

    def send(self, msg: Any) -> None:
        self.writer.write(p.frame(msg))


class LogTail:
    """Reads what the trainer appended to trainer.log: log-line telemetry and the last lines."""

    def __init__(self, path: Path, pattern: str | None) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.regex = re.compile(pattern or NANOGPT_PATTERN)
        self._rest = b""
        self.lines: list[str] = []

    def read(self) -> list[tuple[int, float | None, float | None]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offset += len(data)
        data = self._rest + data
        *whole, self._rest = data.split(b"\n")
        out: list[tuple[int, float | None, float | None]] = []
        for raw in whole:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            m = self.regex.search(line)
            if m is None:
                continue
            g = m.groupdict()
            try:
                step = int(g["step"])
                loss = float(g["loss"]) if g.get("loss") is not None else None
                lr = float(g["lr"]) if g.get("lr") is not None else None
            except (KeyError, ValueError):
                continue
            out.append((step, loss, lr))
        del self.lines[:-400]
        return out


class Keeper:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.record = runs.read_record(run_dir)
        rec = self.record
        self.options: dict[str, Any] = rec.options
        self.state = RunState(
            run_id=rec.run_id, argv=rec.argv, cwd=rec.cwd, created=rec.created, options=rec.options
        )
        self.journal = Journal(run_dir / runs.JOURNAL_NAME)
        self.sock_path = run_dir / runs.SOCKET_NAME
        self.log_path = run_dir / runs.LOG_NAME
        self.conns: set[Conn] = set()
        self.proc: asyncio.subprocess.Process | None = None
        self.attempt_n = 0
        self.config, self.config_note = _load_config(rec)
        self.tail = LogTail(self.log_path, self.options.get("log_pattern") or self.config.log.pattern)
        self.stop_event = asyncio.Event()
        self.idle_since: float | None = None
        self.linger_s = float(self.options.get("linger_s", DEFAULT_LINGER_S))
        self._dirty_clients = False
        self._finding_journaled: dict[str, float] = {}
        self.uid = os.getuid()
        if self.options.get("fake_nvml"):
            # The demo's GPU faults on a machine without one: the trainer writes the scenario the
            # keeper's fake NVML reads (see probes/fake_nvml.py); both inherit this variable.
            os.environ["TRAINROOM_FAKE_NVML"] = str(run_dir / "fake-nvml.json")
        n_auto = int(self.options.get("auto_resume") or self.config.auto_resume.max or 0)
        from trainroom.core.keeper.recovery import AutoResume

        self.auto_resume: Any = AutoResume(self, n_auto) if n_auto > 0 else None
        self.watch = _load_watch(self)
        self.actions = _load_actions(self)

    # ------------------------------------------------------------------ what actions need

    def lock_files(self) -> list[str]:
        files = list(self.options.get("lock_files") or [])
        for f in self.config.lock_files:
            path = f if os.path.isabs(f) else os.path.join(self.record.cwd, f)
            if path not in files:
                files.append(path)
        return files

    def gpu_probe(self) -> Any:
        return self.watch.gpu_probe() if self.watch is not None else None

    def reclaim_roots(self) -> dict[str, str]:
        # Tests point reclaim at a temporary tree that mimics /sys/fs/cgroup and /proc.
        return {
            "sys_root": os.environ.get("TRAINROOM_SYS_ROOT", "/sys/fs/cgroup"),
            "proc_root": os.environ.get("TRAINROOM_PROC_ROOT", "/proc"),
        }

    def trainer_python(self) -> str:
        """The trainer's interpreter (it has torch) when the command names one, else ours."""
        argv = self.record.argv
        if argv and "python" in os.path.basename(argv[0]):
            return argv[0]
        return sys.executable

    # ------------------------------------------------------------------ records

    def emit(self, rec: Any, journal: bool = True) -> None:
        """Fold a record into the run, journal it, and queue it for every live client."""
        self.state.apply(rec)
        if self.watch is not None:
            self.watch.observe(rec)
        if journal:
            self.journal.append(rec)
        for c in self.conns:
            if c.live:
                c.pending.append(rec)
        self._dirty_clients = True

    def set_findings(self, found: list[Finding], now: float) -> None:
        """Raise what is new, refresh what stays, clear what the rules no longer return."""
        current = self.state.findings
        seen: set[str] = set()
        for f in found:
            ident = f.ident
            seen.add(ident)
            old = current.get(ident)
            if old is None:
                f.first_seen = f.first_seen or now
                f.last_seen = now
                self._finding_journaled[ident] = now
                self.emit(p.FindingRaised(finding=f))
            else:
                f.first_seen, f.last_seen = old.first_seen, now
                if old.severity != f.severity:
                    self._finding_journaled[ident] = now
                    self.emit(p.FindingRaised(finding=f))
                elif old.message != f.message:
                    # Live figures in a message reach clients at once, the journal at most every
                    # FINDING_REJOURNAL_S: a day of NaN steps must not write a record per tick.
                    due = now - self._finding_journaled.get(ident, 0.0) >= FINDING_REJOURNAL_S
                    if due:
                        self._finding_journaled[ident] = now
                    self.emit(p.FindingRaised(finding=f), journal=due)
                else:
                    current[ident] = f
        for ident in [i for i in current if i not in seen]:
            self._finding_journaled.pop(ident, None)
            self.emit(p.FindingCleared(ident=ident, t=now))

    def set_status(self, state: str, reason: str, now: float) -> None:
        if (state, reason) != (self.state.status, self.state.status_reason):
            self.emit(p.RunStatus(t=now, state=state, reason=reason))

    # ------------------------------------------------------------------ attempts

    async def start_attempt(
        self,
        argv: list[str] | None = None,
        resume_from: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> p.AttemptStarted | p.AttemptEnded:
        self.attempt_n += 1
        n = self.attempt_n
        argv = argv or self.record.argv
        env = dict(os.environ)
        env.update(
            {
                "TRAINROOM_SOCKET": str(self.sock_path),
                "TRAINROOM_RUN": self.record.run_id,
                "TRAINROOM_RUN_DIR": str(self.run_dir),
                "TRAINROOM_ATTEMPT": str(n),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.options.get("ckpt_root"):
            env["TRAINROOM_CKPT_ROOT"] = str(self.options["ckpt_root"])
        if self.options.get("disk_budget_bytes"):
            # The SDK's pre-save check refuses a checkpoint the budget cannot take.
            env["TRAINROOM_DISK_BUDGET"] = str(int(self.options["disk_budget_bytes"]))
        if resume_from:
            env["TRAINROOM_RESUME"] = resume_from
        else:
            env.pop("TRAINROOM_RESUME", None)
        env.update(extra_env or {})
        now = time.time()
        with open(self.log_path, "ab") as log:
            log.write(
                f"=== trainroom: attempt {n} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{' '.join(argv)} ===\n".encode()
            )
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.record.cwd,
                    env=env,
                    process_group=0,
                )
            except OSError as exc:
                log.write(f"=== trainroom: could not start: {exc} ===\n".encode())
                started = p.AttemptStarted(
                    n=n,
                    t=now,
                    pid=0,
                    pgid=0,
                    start_time=0.0,
                    argv=argv,
                    cwd=self.record.cwd,
                    resume_from=resume_from,
                )
                self.emit(started)
                ended = p.AttemptEnded(n=n, t=time.time(), exit_code=127, error=f"could not start: {exc}")
                self.emit(ended)
                self.journal.flush()
                return ended
        try:
            start_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            start_time = now
        self.proc = proc
        started = p.AttemptStarted(
            n=n,
            t=now,
            pid=proc.pid,
            pgid=proc.pid,
            start_time=start_time,
            start_ticks=procs.start_ticks(proc.pid),
            argv=argv,
            cwd=self.record.cwd,
            resume_from=resume_from,
            requested=_requested_from_argv(argv),
        )
        self.emit(started)
        self.journal.flush()
        if self.watch is not None:
            self.watch.start_attempt(self, started)
        asyncio.get_running_loop().create_task(self._wait_attempt(n, proc))
        return started

    async def _wait_attempt(self, n: int, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        now = time.time()
        # Read what the trainer wrote last before calling it: a traceback there is the cause.
        self._read_log(now)
        ended = p.AttemptEnded(
            n=n, t=now, exit_code=rc if rc >= 0 else None, exit_signal=-rc if rc < 0 else None
        )
        self.emit(ended)
        a = self.state.attempt
        if a is not None and a.n == n and rc != 0 and a.crash is None and self.watch is not None:
            crash = self.watch.crash_from_log("\n".join(self.tail.lines))
            if crash is not None:
                self.emit(p.Received(attempt=n, rank=0, t=now, msg=crash))
        self.journal.flush(fsync=True)
        if self.proc is proc:
            self.proc = None
        self.evaluate(now)
        self.flush_clients()
        if self.watch is not None:
            await self.watch.attempt_ended(self, ended)

    # ------------------------------------------------------------------ loops

    def evaluate(self, now: float) -> None:
        if self.watch is not None:
            state, reason, found = self.watch.evaluate(self, now)
        else:
            state, reason, found = _basic_verdict(self.state), "", []
        self.set_status(state, reason, now)
        self.set_findings(found, now)

    def _read_log(self, now: float) -> None:
        a = self.state.attempt
        for step, loss, lr in self.tail.read():
            if a is None or a.instrumented:
                continue  # the reporter's frames are exact; log lines would double them
            self.emit(
                p.Received(
                    attempt=a.n,
                    rank=0,
                    t=now,
                    msg=p.Step(step=step, t=now, loss=loss, lr=[lr] if lr is not None else [], source="log"),
                )
            )

    async def tick_loop(self) -> None:
        while not self.stop_event.is_set():
            now = time.time()
            self._read_log(now)
            self.evaluate(now)
            self.flush_clients()
            self.journal.flush()
            self._check_linger(now)
            await asyncio.sleep(TICK_S)

    async def probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            if self.watch is not None:
                try:
                    targets = self.watch.targets()
                    sample = await loop.run_in_executor(None, self.watch.probe, targets)
                except Exception as exc:  # a probe must never take the keeper down
                    now = time.time()
                    why = f"host probe failed: {type(exc).__name__}: {exc}"
                    sample = p.ProbeSample(t=now, host=HostSample(t=now, available=False, reason=why))
                self.emit(sample, journal=False)
            # Re-arm only after the previous probe ended, so probes never overlap.
            await asyncio.sleep(max(0.05, PROBE_S - (time.monotonic() - t0)))

    def _check_linger(self, now: float) -> None:
        busy = self.proc is not None or any(c.role == "client" for c in self.conns)
        if busy:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since > self.linger_s:
            self.emit(p.KeeperNote(t=now, message=f"keeper exits after {self.linger_s:.0f} s idle"))
            self.stop_event.set()

    def flush_clients(self) -> None:
        if not self._dirty_clients:
            return
        self._dirty_clients = False
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
                self.emit(p.ConnectionClosed(t=time.time(), peer_pid=c.peer_pid, reason=reason))
        with contextlib.suppress(Exception):
            c.writer.close()
        if c.role == "trainer":
            rank = self.state.ranks.get(c.rank)
            if rank is not None and rank.attempt == c.attempt:
                rank.connected = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer_pid = None
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
                data = await reader.read(1 << 16)
                if not data:
                    break  # a trainer that went away: its attempt's exit says why
                for msg in frames.feed(data):
                    await self._on_message(c, msg)
        except p.ProtocolError as exc:
            reason = f"protocol error from pid {peer_pid}: {exc}"
        except (ConnectionError, OSError):
            reason = None
        except Exception as exc:
            reason = f"internal error on connection from pid {peer_pid}: {type(exc).__name__}: {exc}"
        self._close(c, reason)

    async def _on_message(self, c: Conn, msg: Any) -> None:
        now = time.time()
        if c.role is None:
            if isinstance(msg, p.Hello):
                if msg.v != p.PROTOCOL_VERSION:
                    raise p.ProtocolError(f"protocol version {msg.v}, keeper speaks {p.PROTOCOL_VERSION}")
                c.role, c.rank, c.attempt = "trainer", msg.rank, self.attempt_n
            elif isinstance(msg, p.Subscribe):
                c.role, c.name = "client", msg.client
                c.send(p.Snapshot(v=p.PROTOCOL_VERSION, state=to_snapshot(self.state)))
                if msg.live:
                    c.live = True
                else:
                    await c.writer.drain()
                    self._close(c, None)
                return
            elif isinstance(msg, p.Request):
                c.role = "client"
            else:
                raise p.ProtocolError(f"first message was {type(msg).__name__}, not hello/subscribe/request")
        if c.role == "trainer":
            if isinstance(msg, (p.Subscribe, p.Request)):
                raise p.ProtocolError("a trainer connection sent a client message")
            self.emit(p.Received(attempt=c.attempt, rank=c.rank, t=now, msg=msg))
        else:
            if isinstance(msg, p.Request):
                asyncio.get_running_loop().create_task(self._serve_request(c, msg))
            elif not isinstance(msg, p.Subscribe):
                raise p.ProtocolError(f"a client connection sent {type(msg).__name__}")

    async def _serve_request(self, c: Conn, req: p.Request) -> None:
        def reply(r: p.Reply) -> None:
            with contextlib.suppress(Exception):
                c.send(r)

        try:
            await self.actions.serve(self, req, reply, c.name)
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

    # ------------------------------------------------------------------ main

    async def main(self) -> int:
        if self.sock_path.exists():
            self.sock_path.unlink()
        # Bound and listening under a temporary name, then renamed into place: `launch` returns
        # once keeper.sock exists, and a client connecting between bind() and listen() on a
        # loaded machine would be refused.
        bind_path = self.sock_path.with_name(".bind.sock")
        with contextlib.suppress(FileNotFoundError):
            bind_path.unlink()
        old_umask = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self.handle, path=str(bind_path), limit=1 << 20)
        finally:
            os.umask(old_umask)
        os.chmod(bind_path, 0o600)
        # The record names this keeper before the socket appears: `launch` returns on the socket,
        # and a reader in between would take the run for one whose keeper is gone.
        me = psutil.Process()
        self.record.keeper_pid, self.record.keeper_start_time = me.pid, me.create_time()
        self.record.keeper_start_ticks = procs.start_ticks(me.pid)
        runs.write_record(self.run_dir, self.record)
        os.replace(bind_path, self.sock_path)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        self.emit(
            p.KeeperStarted(
                t=time.time(),
                pid=me.pid,
                start_ticks=self.record.keeper_start_ticks,
                thresholds=self.config.thresholds,
            )
        )
        if self.config_note:
            self.emit(p.KeeperNote(t=time.time(), message=self.config_note, kind="warning"))
        await self.start_attempt()
        tasks = [loop.create_task(self.tick_loop()), loop.create_task(self.probe_loop())]
        await self.stop_event.wait()
        for t in tasks:
            t.cancel()
        server.close()
        for c in list(self.conns):
            self._close(c, None)
        with contextlib.suppress(FileNotFoundError):
            self.sock_path.unlink()
        self.journal.close()
        return 0


def _load_config(rec: runs.RunRecord) -> tuple[Any, str | None]:
    """The run's trainroom.toml (project dir, then state dir); a bad one falls back to the
    defaults here, with a note: `launch` already refused it with exit 2 when it was given."""
    from trainroom.core.config import Config, ConfigError, load_config

    try:
        cfg, _path = load_config(rec.cwd, runs.state_dir())
        return cfg.resolved(rec.cwd) if hasattr(cfg, "resolved") else cfg, None
    except ConfigError as exc:
        return Config(), f"config ignored: {exc}"


def _basic_verdict(st: RunState) -> str:
    a = st.attempt
    if a is None:
        return "starting"
    if a.ended_at is not None:
        return "exited" if a.exit_code == 0 else "dead"
    return "running" if a.last_step is not None else "starting"


def _requested_from_argv(argv: list[str]) -> p.RequestedConfig:
    try:
        from trainroom.core.sdk.lr import requested_from_argv
    except ImportError:
        return p.RequestedConfig()
    return requested_from_argv(argv)


def _load_watch(keeper: Keeper) -> Any:
    try:
        from trainroom.core.keeper.supervision import Supervision
    except ImportError:
        return None
    return Supervision(keeper)


def _load_actions(keeper: Keeper) -> Any:
    from trainroom.core.keeper.actions import Actions

    return Actions(keeper)


def run_keeper(run_dir: str) -> int:
    d = Path(run_dir)
    keeper = Keeper(d)
    return asyncio.run(keeper.main())


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m trainroom.core.keeper RUN_DIR", file=sys.stderr)
        return 2
    return run_keeper(args[0])


if __name__ == "__main__":
    sys.exit(main())
