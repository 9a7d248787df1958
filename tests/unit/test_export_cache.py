"""The exporter's shared collections: concurrent scrapes ask the keepers once per round (the
ones arriving during a collection share the next), each format is encoded once, and a scrape
never gets a collection that started before it arrived. A real HTTP server on 127.0.0.1 and real
scrapes."""

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
    cache = CachedExposition(inner)
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
    assert len(bodies) == 100 and all(b"trainroom_runs_live" in b for b in bodies)
    # The first scrape's collection, then one for all that arrived while it ran (a loaded machine
    # may spread the arrivals over a third).
    assert 1 <= inner.calls <= 3 and cache.collections == inner.calls
    assert om and all(c.startswith("application/openmetrics-text") for c in om)
    assert sum(b.endswith(b"# EOF\n") for b in bodies) == 50  # each format as asked


def test_a_scrape_after_a_collection_gets_a_new_one() -> None:
    inner = Counting()
    cache = CachedExposition(inner)
    first, _ = cache.body(None)
    second, _ = cache.body(None)
    assert b"trainroom_runs_live 1.0" in first and b"trainroom_runs_live 2.0" in second
