"""The exporter's shared collection: concurrent scrapes within its window ask the keepers once,
each format is encoded once, and the window's end brings a new collection. A real HTTP server
on 127.0.0.1 and real scrapes."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainroom.core.cli.export import CachedExposition, serve


class Counting(Collector):
    """A collection that takes a while (as asking keepers does) and counts how often it ran."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterator[Metric]:
        self.calls += 1
        time.sleep(0.2)
        g = GaugeMetricFamily("trainroom_runs_live", "Runs whose keeper is up")
        g.add_metric([], self.calls)
        yield g


def test_concurrent_scrapes_share_one_collection_and_each_gets_the_figures() -> None:
    inner = Counting()
    cache = CachedExposition(inner, ttl=60.0)
    server, thread = serve(0, "127.0.0.1", cache)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    bodies: list[bytes] = []
    om: list[str] = []

    def scrape(openmetrics: bool) -> None:
        headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            bodies.append(resp.read())
            if openmetrics:
                om.append(resp.headers["Content-Type"])

    try:
        threads = [threading.Thread(target=scrape, args=(i % 2 == 0,)) for i in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.shutdown()
        thread.join(5)
    assert len(bodies) == 100 and all(b"trainroom_runs_live 1.0" in b for b in bodies)
    assert inner.calls == 1 and cache.collections == 1
    assert om and all(c.startswith("application/openmetrics-text") for c in om)
    assert sum(b.endswith(b"# EOF\n") for b in bodies) == 50  # each format as asked


def test_a_collection_older_than_its_window_is_taken_again() -> None:
    inner = Counting()
    cache = CachedExposition(inner, ttl=0.0)
    first, _ = cache.body(None)
    second, _ = cache.body(None)
    assert b"trainroom_runs_live 1.0" in first and b"trainroom_runs_live 2.0" in second
