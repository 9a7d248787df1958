"""A volatile finding's words with the figures of now (`run.nowwords`): the watchdog pins the
words it opened with (so the journal is not rewritten each tick) while its evidence moves; every
view re-words from the evidence, exactly as the rule itself words it then."""

from __future__ import annotations

import msgspec

from tests.support.run_builder import RunBuilder
from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.host import host_ram_low
from trainroom.core.health.progress import slow_check
from trainroom.core.health.watchdog import WatchContext, Watchdog
from trainroom.core.run.nowwords import now_findings, now_message
from trainroom.core.run.parts import RankView
from trainroom.core.run.status import status_dict
from trainroom.core.samples import HostSample

GiB = 1 << 30


def _stalled(v: object) -> Finding:
    return next(f for f in v.findings if f.code == "STALLED")  # type: ignore[attr-defined]


def test_a_stall_says_the_gap_of_now_while_its_journaled_words_keep_still() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    last = b.now
    ctx = WatchContext(alive=True, proc_states={4242: "R"})
    b.now = last + 10.2
    b.beat()
    opened = _stalled(wd.evaluate(b.run, ctx, b.now))
    b.now = last + 25.0
    b.beat()
    later = _stalled(wd.evaluate(b.run, ctx, b.now))
    assert later.message == opened.message and "no step for 10 s" in later.message  # pinned (test_watchdog)
    said = now_message(later, None)
    assert "no step for 25 s" in said and "no step for 10 s" not in said
    assert said == opened.message.replace("no step for 10 s", "no step for 25 s")
    # Measured at last_seen; a watching reader's clock ages it until the next measurement.
    later.last_seen = b.now
    assert "no step for 40 s" in now_message(later, b.now + 15)
    # `status` says the same words as the control room (both read now_findings).
    b.run.findings[later.ident] = later
    d = status_dict(b.run, now=b.now + 15)
    (row,) = [f for f in d["findings"] if f["code"] == "STALLED"]
    assert row["message"] == now_message(later, b.now + 15)
    # A journal read with no keeper watching: the figures it last measured, no clock added.
    assert now_findings([later], None)[0].message == said
    assert b.run.findings[later.ident].message == opened.message  # the run's own finding untouched


def test_host_ram_low_says_the_gib_its_evidence_last_measured_in_the_rule_s_own_words() -> None:
    host = HostSample(t=0, available=True, mem_available_bytes=int(2.1 * GiB), page_cache_bytes=6 * GiB)
    opened = host_ram_low(int(2.1 * GiB), floor_bytes=3 * GiB, host=host)
    host2 = msgspec.structs.replace(host, mem_available_bytes=int(1.2 * GiB), page_cache_bytes=2 * GiB)
    now = host_ram_low(int(1.2 * GiB), floor_bytes=3 * GiB, host=host2)
    assert opened is not None and now is not None and opened.message != now.message
    pinned = msgspec.structs.replace(now, message=opened.message)  # what the watchdog's pin sends
    assert now_message(pinned, None) == now.message


def test_slow_says_the_ratio_its_evidence_last_measured_in_the_rule_s_own_words() -> None:
    th = Thresholds()
    k = th.slow_steps
    base = [0.1] * (th.slow_baseline_min + 5)

    def rank(recent: float) -> RankView:
        return RankView(rank=0, attempt=1, intervals=[*base, *([recent] * k)])

    opened, now = slow_check([rank(0.35)], th), slow_check([rank(0.8)], th)
    assert opened is not None and now is not None and opened.message != now.message
    pinned = msgspec.structs.replace(now, message=opened.message)
    assert now_message(pinned, None) == now.message
    assert "8.0x" in now_message(pinned, None)
