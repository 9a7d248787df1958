"""`trainroom export --port N [--bind 127.0.0.1]`: every live run under TRAINROOM_HOME in the
Prometheus/OpenMetrics text format, for the dashboards people already run (the model:
nvitop-exporter and dcgm-exporter for GPUs).

prometheus_client writes the format (its own registry, one custom collector, content negotiated
per scrape). On each scrape the collector asks each live keeper for a snapshot through
KeeperClient (as `status` does) and reads the figures `status --json` reports; a figure nobody
measured is left out, never exported as 0. Labels: run, job (the trainer's script or module
name), host, and rank (per-rank figures). Binds to loopback unless told otherwise.

Many scrapers at once (several Prometheus servers, a dashboard's refreshes, a probe) share
collections: the scrapes that arrive while one runs are all answered by the next, so the keepers
are asked once per round whatever the number of scrapes, each format is encoded once per
collection, and the server (a thread per request) listens with a deep backlog, so a burst of
connections waits in the queue rather than in SYN retries.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from trainroom.core import vocab
from trainroom.core.cli.errors import CliError
from trainroom.core.cli.export_gpu import gpu_metrics
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.run.state import RunState
from trainroom.core.run.status import status_dict

STATES = vocab.WATCH_STATES  # export reads live keepers: their watchdog states
CHECKPOINT_STATES = vocab.CKPT_STATES
SNAPSHOT_TIMEOUT_S = 2.0  # one keeper that does not answer must not hold the whole scrape
BACKLOG = 1024  # connections the kernel queues while every thread is busy
MAX_CONNECTIONS = 128  # held at once (fewer under a low fd limit: see connection_cap)
IDLE_S = 10.0  # a connection that sends nothing (or stalls mid-request) this long is closed
RUN_LABELS = ["run", "job", "host"]
RANK_LABELS = ["run", "job", "host", "rank"]


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("export", help="serve every live run's metrics for Prometheus (loopback by default)")
    sp.add_argument("--port", type=int, required=True, help="TCP port (0: any free one, printed)")
    sp.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sp.set_defaults(func=cmd_export)


def job_of(run_id: str) -> str:
    """`20261202-172724-train-1994` -> `train`: what the run's id says it runs."""
    parts = run_id.split("-")
    return "-".join(parts[2:-1]) or run_id


class _Families:
    """The metric families of one scrape, filled run by run."""

    def __init__(self) -> None:
        self.all: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
        m = self.all.get(name)
        if m is None:
            m = self.all[name] = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
        assert isinstance(m, GaugeMetricFamily)
        return m

    def counter(self, name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
        m = self.all.get(name)
        if m is None:
            m = self.all[name] = CounterMetricFamily(name, doc, labels=labels)
        assert isinstance(m, CounterMetricFamily)
        return m

    def put(self, name: str, doc: str, labels: dict[str, str], value: float | None, unit: str = "") -> None:
        """A gauge sample; an unmeasured (None) or non-numeric figure is left out."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        self.gauge(name, doc, list(labels), unit).add_metric(list(labels.values()), float(value))


class RunsCollector(Collector):
    """Every live run under the state dir, read from its keeper at scrape time."""

    def __init__(self) -> None:
        self.host = socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        f = _Families()
        live = [r for r in runs.list_runs() if r.alive]
        f.put("trainroom_runs_live", "Runs under TRAINROOM_HOME whose keeper is up", {}, len(live))
        for info in live:
            base = {"run": info.run_id, "job": job_of(info.run_id), "host": self.host}
            t0 = time.monotonic()
            try:
                client = KeeperClient(info.sock, timeout_s=SNAPSHOT_TIMEOUT_S)
                try:
                    st = client.subscribe(client="export", live=False)
                finally:
                    client.close()
            except (KeeperGone, OSError):
                f.put("trainroom_keeper_up", "1 when the run's keeper answered this scrape", base, 0)
                continue
            f.put("trainroom_keeper_up", "1 when the run's keeper answered this scrape", base, 1)
            f.put(
                "trainroom_keeper_snapshot_seconds",
                "How long the keeper took to answer this scrape's snapshot",
                base,
                time.monotonic() - t0,
            )
            _keeper_process(f, base, st)
            _run_metrics(f, base, st)
        yield from f.all.values()


def _keeper_process(f: _Families, base: dict[str, str], st: RunState) -> None:
    """The keeper's own health: its memory and CPU (read from /proc by psutil)."""
    if st.keeper_pid is None:
        return
    try:
        proc = psutil.Process(st.keeper_pid)
        with proc.oneshot():
            rss = proc.memory_info().rss
            cpu = proc.cpu_times()
            started = proc.create_time()
    except psutil.Error:
        return
    f.put("trainroom_keeper_resident_memory_bytes", "The keeper's resident memory", base, rss)
    f.put("trainroom_keeper_start_time_seconds", "When the keeper started (Unix time)", base, started)
    f.counter("trainroom_keeper_cpu_seconds", "CPU time the keeper used", list(base)).add_metric(
        list(base.values()), cpu.user + cpu.system
    )


def _run_metrics(f: _Families, base: dict[str, str], st: RunState) -> None:
    d = status_dict(st)
    for s in STATES:
        f.put(
            "trainroom_run_state",
            "1 for the run's state, 0 for the others",
            {**base, "state": s},
            int(d["state"] == s),
        )
    f.put("trainroom_run_attempt", "The attempt running (or last run)", base, d["attempt"])
    f.put("trainroom_step", "The run's step (the slowest rank's)", base, d["step"])
    f.put("trainroom_step_age_seconds", "Seconds since the last step", base, d["step_age_s"])
    f.put(
        "trainroom_steps_per_second",
        "Steps per second (median interval of the slowest rank)",
        base,
        d["steps_per_s"],
    )
    f.put("trainroom_loss", "The median loss across ranks", base, _num(d["loss"]))
    f.put("trainroom_lr_requested", "The learning rate the session asked for", base, d["lr"]["requested"])
    vram, host, disk = d["vram"], d["host"], d["disk"]
    f.put(
        "trainroom_vram_driver_available",
        "1 when the driver (NVML) answers for the run's devices",
        base,
        int(bool(vram["driver_available"])),
    )
    f.put(
        "trainroom_vram_driver_used_bytes",
        "VRAM in use, the driver's view (the run's devices)",
        base,
        vram["driver_used_bytes"],
    )
    f.put(
        "trainroom_vram_driver_total_bytes",
        "VRAM on the run's devices, the driver's view",
        base,
        vram["driver_total_bytes"],
    )
    f.put(
        "trainroom_vram_driver_run_bytes",
        "VRAM the driver attributes to the run's processes",
        base,
        vram["driver_run_bytes"],
    )
    f.put(
        "trainroom_host_memory_available_bytes",
        "MemAvailable (cgroup-aware)",
        base,
        host["mem_available_bytes"],
    )
    f.put("trainroom_host_page_cache_bytes", "Host page cache", base, host["page_cache_bytes"])
    f.put("trainroom_host_memory_total_bytes", "Host memory", base, host["mem_total_bytes"])
    f.put(
        "trainroom_disk_used_ratio",
        "Used fraction of the checkpoint disk (or budget)",
        base,
        disk["used_fraction"],
    )
    f.put(
        "trainroom_disk_free_bytes", "Free bytes on the checkpoint disk (or budget)", base, disk["free_bytes"]
    )
    f.put(
        "trainroom_disk_time_to_full_seconds",
        "Seconds until the checkpoint disk fills at the current rate",
        base,
        disk["time_to_full_s"],
    )
    for state in CHECKPOINT_STATES:
        n = sum(c.state == state for c in st.checkpoints)
        f.put("trainroom_checkpoints", "Checkpoints by state", {**base, "state": state}, n)
    open_by: dict[tuple[str, str], int] = {}
    for x in st.findings.values():
        open_by[(x.code, x.severity)] = open_by.get((x.code, x.severity), 0) + 1
    for (code, severity), n in sorted(open_by.items()):
        f.put(
            "trainroom_findings_open",
            "Open findings by code and severity",
            {**base, "code": code, "severity": severity},
            n,
        )
    alerts = f.counter(
        "trainroom_alerts", "Alert delivery outcomes since the keeper started", [*base, "outcome"]
    )
    for outcome, n in sorted(st.notify_outcomes.items()):
        alerts.add_metric([*base.values(), outcome], n)
    _rank_metrics(f, base, st)
    gpu_metrics(f.put, base, d["gpu"])


def _rank_metrics(f: _Families, base: dict[str, str], st: RunState) -> None:
    for r in sorted(st.ranks.values(), key=lambda r: r.rank):
        lab = {**base, "rank": str(r.rank)}
        f.put("trainroom_rank_step", "The rank's last step", lab, r.step)
        f.put("trainroom_rank_loss", "The rank's last loss", lab, _num(r.loss))
        f.put("trainroom_rank_step_seconds", "The rank's median step interval", lab, r.median_interval)
        f.put("trainroom_rank_tokens_per_second", "The rank's tokens per second", lab, r.tokens_per_s)
        f.put(
            "trainroom_vram_allocator_allocated_bytes",
            "VRAM the rank's allocator holds in tensors",
            lab,
            r.alloc_allocated,
        )
        f.put(
            "trainroom_vram_allocator_reserved_bytes",
            "VRAM the rank's allocator reserved",
            lab,
            r.alloc_reserved,
        )
        for i, lr in enumerate(r.lr):
            f.put(
                "trainroom_lr_effective",
                "The optimizer's effective LR per param group",
                {**lab, "param_group": str(i)},
                lr,
            )


def _num(x: Any) -> float | None:
    """status' loss is a number, a string for a non-finite one ("nan"), or None."""
    if isinstance(x, str):
        return float(x)
    return x if isinstance(x, (int, float)) else None


class CachedExposition:
    """Scrapes that arrive together share one collection: a scrape is answered from a collection
    that started after it arrived (never older figures than a scrape of its own would give), and
    every scrape waiting for that one gets it; each format is encoded once per collection."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._cond = threading.Condition()
        self._running = False
        self._started = 0  # collections started so far
        self._finished = 0  # the latest collection finished (its number)
        self._families: list[Metric] = []
        self._encoded: dict[str, bytes] = {}
        self.collections = 0

    def collect(self) -> Iterable[Metric]:
        """The registry an encoder reads: the latest collection's families."""
        return self._families

    def body(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        with self._cond:
            need = self._started + 1  # a collection that starts after this scrape arrived
            while self._finished < need:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                mine = self._started
                self._cond.release()
                try:
                    families = list(self.collector.collect())
                except BaseException:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
                    raise
                self._cond.acquire()
                self._families, self._encoded, self._finished = families, {}, mine
                self.collections += 1
                self._running = False
                self._cond.notify_all()
            out = self._encoded.get(content_type)
            if out is None:
                out = self._encoded[content_type] = encoder(self)
            return out, content_type


def connection_cap() -> int:
    """How many connections the exporter holds at once: a quarter of the fd limit, at most
    MAX_CONNECTIONS (each holds an fd and a thread)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 1024
    if soft <= 0:  # RLIM_INFINITY
        soft = 1 << 20
    return max(8, min(MAX_CONNECTIONS, soft // 4))


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `cap` connections held: past it, the oldest connection
    that has not sent a byte yet is closed to make room (idle connections cannot lock the scrapes
    out, however many are opened), and a connection that sends nothing for IDLE_S is closed."""

    daemon_threads = True
    request_queue_size = BACKLOG
    cap = MAX_CONNECTIONS

    def server_activate(self) -> None:
        self._held: dict[socket.socket, bool] = {}  # connection -> it has sent a byte
        self._held_lock = threading.RLock()
        self.cap = connection_cap()
        self.evicted = 0
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._held_lock:
            while len(self._held) >= self.cap:
                idle = next((c for c, busy in self._held.items() if not busy), None)
                if idle is None:
                    break
                del self._held[idle]
                self.evicted += 1
                with contextlib.suppress(OSError):
                    idle.shutdown(socket.SHUT_RDWR)  # its thread reads the end and leaves
            if len(self._held) >= self.cap:
                self.shutdown_request(request)  # every held one is being answered: come back
                return
            self._held[request] = False
        super().process_request(request, client_address)

    def busy(self, conn: socket.socket) -> None:
        with self._held_lock:
            if conn in self._held:
                self._held[conn] = True

    def shutdown_request(self, request: Any) -> None:
        with self._held_lock:
            self._held.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or went away is no news


class _Quiet(WSGIRequestHandler):
    timeout = IDLE_S

    def handle(self) -> None:
        try:
            first = self.connection.recv(1, socket.MSG_PEEK)  # waits at most IDLE_S
        except OSError:
            return
        if not first:
            return
        server = self.server
        if isinstance(server, _Server):
            server.busy(self.connection)
        super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def wsgi_app(cache: CachedExposition) -> Callable[..., list[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("404 Not Found", [("Content-Length", "0")])
            return [b""]
        body, content_type = cache.body(environ.get("HTTP_ACCEPT"))
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app


def serve(port: int, bind: str, cache: CachedExposition) -> tuple[WSGIServer, threading.Thread]:
    """The exporter's HTTP server on its own thread (IPv6 when `bind` is an IPv6 address)."""
    family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM)[0][0]

    class Server(_Server):
        address_family = family

    server = make_server(bind, port, wsgi_app(cache), Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def cmd_export(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: expected 0..65535")
    cache = CachedExposition(RunsCollector())
    try:
        server, thread = serve(args.port, args.bind, cache)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"cannot listen on {args.bind}:{args.port}: {why}") from None
    host, port = server.server_address[:2]
    if args.bind not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"trainroom: warning: serving beyond loopback on {args.bind}: anyone who reaches it reads every run",
            file=sys.stderr,
        )
    print(f"serving http://{_url_host(str(host))}:{port}/metrics (runs under {runs.state_dir()})", flush=True)
    stop = threading.Event()
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join(2.0)
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
