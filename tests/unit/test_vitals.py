"""The history graphs' samples: what one probe gives (None where nothing was measured), journaled
only while the trainer runs and every few seconds, kept in the plot series' snapshot and state (so
a reopened control room and a fold of the journal have them), bounded by thinning the old ones."""

from __future__ import annotations

import msgspec

from tests.support.tui_fakes import T0, GiB, build_state, healthy_records
from trainroom.core.run.series import Series, SeriesSnapshot
from trainroom.core.run.vitals import MAX_SAMPLES, RECENT_S, VitalsClock, VitalsHistory, vitals_of
from trainroom.core.samples import ProcRow, ProcsSample, VitalsSample
from trainroom.core.wire import protocol as p


def test_a_probe_gives_the_figures_and_none_where_nothing_was_measured() -> None:
    st = build_state(healthy_records(steps=10))
    v = vitals_of(st, T0)
    assert v is not None
    assert v.mem_used_bytes == 31 * GiB - (2 * GiB + 100 * (1 << 20)) and v.page_cache_bytes == 6 * GiB
    assert v.gpu_util_percent == 97 and v.gpu_power_w == 151.0 and v.gpu_temp_c is None  # not given
    assert v.alloc_reserved_bytes == 6 * GiB and v.disk_free_bytes == 60 * GiB
    assert v.cpu_percent is None and v.disk_write_bps is None  # no process table in that probe
    rows = [
        ProcRow(
            pid=1,
            ppid=0,
            start_ticks=1,
            role="agent",
            state="S",
            elapsed_s=1,
            cpu_percent=50.0,
            write_bps=10.0,
        ),
        ProcRow(pid=2, ppid=1, start_ticks=2, role="rank", state="R", elapsed_s=1, cpu_percent=98.5),
    ]
    st.apply(p.ProbeSample(t=T0 + 10, procs=ProcsSample(attempt=1, table=rows)))
    v2 = vitals_of(st, T0 + 10)
    assert v2 is not None and v2.cpu_percent == 148.5 and v2.disk_write_bps == 10.0


def test_the_clock_journals_every_few_seconds_and_only_while_the_trainer_runs() -> None:
    st = build_state(healthy_records(steps=10))
    clock = VitalsClock(every_s=5.0)
    assert clock.due(st) is not None
    assert clock.due(st) is None  # the same probe
    st.apply(p.ProbeSample(t=st.probe.t + 2))  # type: ignore[union-attr]
    assert clock.due(st) is None
    st.apply(p.ProbeSample(t=st.probe.t + 5))  # type: ignore[union-attr]
    assert clock.due(st) is not None
    st.apply(p.AttemptEnded(n=1, t=T0 + 100, exit_code=0))
    st.apply(p.ProbeSample(t=T0 + 200))
    assert clock.due(st) is None


def test_the_series_keeps_them_through_its_snapshot_and_its_state() -> None:
    s = Series()
    for i in range(10):
        s.observe_record(p.Vitals(v=VitalsSample(t=T0 + 5 * i, cpu_percent=float(i))))
    snap = msgspec.convert(msgspec.to_builtins(s.snapshot()), SeriesSnapshot)
    assert [v.cpu_percent for v in Series.from_snapshot(snap).vitals.samples] == [float(i) for i in range(10)]
    again = Series.from_state(msgspec.msgpack.decode(msgspec.msgpack.encode(s.state()), type=type(s.state())))
    assert len(again.vitals.samples) == 10


def test_a_long_history_is_thinned_in_its_old_part_never_the_last_hour() -> None:
    h = VitalsHistory()
    n = MAX_SAMPLES + 1
    start = T0
    for i in range(n):
        h.add(VitalsSample(t=start + 5 * i))
    last = h.samples[-1].t
    recent = [v for v in h.samples if v.t >= last - RECENT_S]
    assert len(recent) == int(RECENT_S / 5) + 1  # every sample of the last hour kept
    assert len(h.samples) < n and h.samples[0].t == start  # the old part thinned, its start kept
    h.add(VitalsSample(t=start))  # a replay's older sample: the history only moves forward
    assert h.samples[-1].t == last
