"""Runs that last weeks: what reading one costs, and what its journal takes on disk.

Writes synthetic runs of N step records across 8 ranks (10 steps/s per rank of simulated time, a
heartbeat per rank per second, a verified checkpoint every 1000 steps, a finding now and then)
through the real JournalWriter, the keeper's: its batches, its fold, its snapshots, segments and
retention, the run's own clock timing the batches. Beside each, the same records journaled the
way they were before (one record per step, no snapshot: "today"), read by the same code, which
then replays the whole journal as it always did.

Then times, keeper gone: `trainroom status RUN --json` (a subprocess, as a user runs it) and the
in-process read it makes; `trainroom runs` over one and over 30 such runs (29 of them hard-linked
copies: the same bytes to read); the control room's first frame on the run, headless (Textual's
run_test, from start to the first render with the journal's state) and its `load_view` alone;
journal bytes per step record; and the writer's cost per record against the bare journal's.

    python scripts/bench_longrun.py                      # 10k, 1M and 10M records (new), 10k and 1M (today)
    python scripts/bench_longrun.py --sizes 10000,1000000 --legacy-sizes 10000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from trainroom.core.configuration.sections import JournalPolicy
from trainroom.core.findings import Finding
from trainroom.core.journal import replay, segments, snapshot
from trainroom.core.journal.file import Journal
from trainroom.core.journal.writer import JournalWriter
from trainroom.core.run import store
from trainroom.core.wire import protocol as p

RANKS = 8
RATE = 10.0  # steps per second per rank, simulated
T0 = 1_780_000_000.0


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def records(n_steps: int, ranks: int = RANKS, rate: float = RATE) -> Iterator[p.Record]:
    """A run of n_steps step records (n_steps // ranks steps on each rank), in keeper order. The
    loss and grad norm are float32 values with noise (as `loss.item()` of a float32 tensor)."""
    rnd = random.Random(1)
    gauss = rnd.gauss
    t = T0
    yield p.KeeperStarted(t=t, pid=100)
    yield p.AttemptStarted(n=1, t=t, pid=1000, pgid=1000, start_time=t, argv=["python", "train.py"], cwd="/w")
    yield p.RunStatus(t=t, state="running")
    for r in range(ranks):
        hello = p.Hello(
            pid=1000 + r, rank=r, world_size=ranks, config=p.RequestedConfig(lr=3e-4, vocab_size=50257)
        )
        yield p.Received(attempt=1, rank=r, t=t, msg=hello)
    steps = n_steps // ranks
    beat_every = max(1, int(rate))
    for step in range(1, steps + 1):
        t = T0 + step / rate
        lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * step / steps))
        base = 8.0 * math.exp(-step / (steps / 5 + 1)) + 2.0
        for r in range(ranks):
            msg = p.Step(
                step=step,
                t=t + r * 1e-4,
                tokens=step * 524288,
                loss=_f32(base + gauss(0.0, 0.05)),
                grad_norm=_f32(abs(gauss(1.0, 0.3))),
                lr=[lr, lr * 0.1],
                alloc_allocated=20 << 30,
                alloc_reserved=22 << 30,
                alloc_peak=(23 << 30) + step % 3,
            )
            yield p.Received(attempt=1, rank=r, t=t + r * 1e-4 + 3e-4, msg=msg)
        if step % beat_every == 0:
            for r in range(ranks):
                beat = p.Heartbeat(t=t, main_frame="train.py:212 in train_step", main_frame_age_s=0.02)
                yield p.Received(attempt=1, rank=r, t=t + 5e-4, msg=beat)
        if step % 1000 == 0:
            path = f"/ckpt/step-{step:07d}"
            yield p.Received(
                attempt=1, rank=0, t=t, msg=p.Checkpoint(path=path, step=step, t=t, size_bytes=4 << 30)
            )
            yield p.CheckpointState(path=path, step=step, state="verified", t=t + 20)
        if step % 20000 == 0:
            f = Finding(
                code="LOSS_SPIKE", severity="warning", message=f"loss spike at step {step}", first_seen=t
            )
            yield p.FindingRaised(finding=f)
        if step % 20000 == 100:
            yield p.FindingCleared(ident="LOSS_SPIKE", t=t)
    yield p.AttemptEnded(n=1, t=t + 1, exit_code=0)
    yield p.RunStatus(t=t + 1, state="exited")


def _clock_of(rec: p.Record, last: float) -> float:
    t = getattr(rec, "t", None)
    return float(t) if isinstance(t, float) else last


def new_run(home: Path, name: str) -> tuple[Path, store.RunRecord]:
    d = home / "runs" / name
    d.mkdir(parents=True)
    rec = store.RunRecord(run_id=name, argv=["python", "train.py"], cwd="/w", created=T0)
    store.write_record(d, rec)
    return d, rec


def write_new(
    home: Path, name: str, n: int, policy: JournalPolicy, ranks: int = RANKS, rate: float = RATE
) -> dict[str, float]:
    """The run through the keeper's JournalWriter (a flush every 0.1 s of the run's time, as the
    keeper's tick does)."""
    d, rec = new_run(home, name)
    now = T0
    w = JournalWriter(d, store.fold_of(rec), policy, clock=lambda: now)
    next_tick = T0
    count = 0
    t0 = time.perf_counter()
    for r in records(n, ranks, rate):
        now = _clock_of(r, now)
        w.append(r)
        count += 1
        if now >= next_tick:
            w.flush()
            next_tick = now + 0.1
    w.flush()
    # A keeper killed -9 here, whose last snapshot was lost too: the one before it is what a
    # reader gets (kept aside for the `crashed` copy below).
    prev = d / snapshot.PREVIOUS_NAME
    aside = home / "crash-snapshot" if prev.exists() else None
    if aside is not None:
        shutil.copy(prev, aside)
    w.close()
    secs = time.perf_counter() - t0
    if aside is not None:
        crashed = home.parent / f"{home.name}-crashed" / "runs" / name
        crashed.mkdir(parents=True)
        for f in d.iterdir():
            if f.name.startswith("journal.") or f.name == store.RECORD_NAME:
                os.link(f, crashed / f.name)
        shutil.copy(aside, crashed / snapshot.SNAPSHOT_NAME)
    return {"seconds": secs, "records": count, "bytes": segments.journal_bytes(d), "seals": w.stats.seals}


def write_legacy(home: Path, name: str, n: int, ranks: int = RANKS, rate: float = RATE) -> dict[str, float]:
    """The same records one per frame, no snapshot: what a keeper journaled before."""
    d, _rec = new_run(home, name)
    j = Journal(d / store.JOURNAL_NAME)
    t0 = time.perf_counter()
    count = 0
    for r in records(n, ranks, rate):
        j.append(r)
        count += 1
        if count % 4096 == 0:
            j.flush()
    j.close()
    return {"seconds": time.perf_counter() - t0, "records": count, "bytes": segments.journal_bytes(d)}


def keeper_cost(root: Path, n: int = 200_000) -> dict[str, float]:
    """The keeper's cost per record, records made beforehand: the bare journal (before) against
    the JournalWriter (batch, fold, snapshots), and the live fold every keeper does either way."""
    recs = list(records(n))
    out: dict[str, float] = {}
    d, rec = new_run(root / "cost", "bare")
    j = Journal(d / store.JOURNAL_NAME)
    t0 = time.perf_counter()
    for i, r in enumerate(recs):
        j.append(r)
        if i % 100 == 0:
            j.flush()
    j.close()
    out["journal_us"] = (time.perf_counter() - t0) / len(recs) * 1e6
    d, rec = new_run(root / "cost", "writer")
    now = T0
    w = JournalWriter(d, store.fold_of(rec), JournalPolicy(), clock=lambda: now)
    t0 = time.perf_counter()
    for i, r in enumerate(recs):
        now = _clock_of(r, now)
        w.append(r)
        if i % 100 == 0:
            w.flush()
    w.close()
    out["writer_us"] = (time.perf_counter() - t0) / len(recs) * 1e6
    view = store.empty_view(rec)
    t0 = time.perf_counter()
    for r in recs:
        view.apply(r)
    out["live_fold_us"] = (time.perf_counter() - t0) / len(recs) * 1e6
    return out


def clone(src: Path, home: Path, name: str) -> None:
    """A copy of a run under another id: hard links (the same bytes to read), a record of its own."""
    d = home / "runs" / name
    d.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != store.RECORD_NAME:
            os.link(f, d / f.name)
    rec = store.read_record(src)
    rec.run_id = name
    store.write_record(d, rec)


def timed(fn: Callable[[], object], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def cli(home: Path, *args: str, src: str | None = None) -> Callable[[], object]:
    """The CLI in a subprocess; `src`: another checkout's src/ (the code before this change)."""
    env = {**os.environ, "TRAINROOM_HOME": str(home)}
    if src:
        env["PYTHONPATH"] = src

    def run() -> None:
        done = subprocess.run([sys.executable, "-m", "trainroom.cli", *args], env=env, capture_output=True)
        if done.returncode != 0:
            raise SystemExit(f"trainroom {' '.join(args)} failed: {done.stderr.decode()}")

    return run


def first_frame(home: Path, run_id: str) -> float:
    """Seconds from starting the control room (headless, 160x48) to its first frame with the
    journal's state on it."""
    os.environ["TRAINROOM_HOME"] = str(home)
    from trainroom.tui.app import ControlRoom

    async def go() -> float:
        t0 = time.perf_counter()
        app = ControlRoom(run_id)
        async with app.run_test(size=(160, 48)) as pilot:
            while app.state is None:
                await pilot.pause(0.005)
            await pilot.pause()
            return time.perf_counter() - t0

    return asyncio.run(go())


def _fmt_s(s: float) -> str:
    return f"{s:.3f}" if s < 10 else f"{s:.1f}"


class Case:
    """One run to read (and its 30 copies), with what each reading costs, measured in rounds."""

    def __init__(self, kind: str, n: int, home: Path, name: str, made: dict[str, float]) -> None:
        self.kind, self.n, self.home, self.name = kind, n, home, name
        self.res = dict(made)
        self.samples: dict[str, list[float]] = {}

    @property
    def run_dir(self) -> Path:
        return self.home / "runs" / self.name

    def add(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds)

    def medians(self) -> dict[str, float]:
        return {**self.res, **{k: statistics.median(v) for k, v in self.samples.items()}}


def _measure_round(c: Case, root: Path, runs: int, src: str | None, heavy: bool) -> None:
    """One of each reading of one run. `heavy`: also the slow ones (today's 30 runs of 1M)."""
    rec = store.read_record(c.run_dir)
    c.add("status_cli", timed(cli(c.home, "status", c.name, "--json", src=src), 1))
    c.add("status_inproc", timed(lambda: store.load_state(c.run_dir), 1))
    c.add("load_view", timed(lambda: store.load_view(c.run_dir), 1))
    c.add("runs_1", timed(cli(c.home, "runs", src=src), 1))
    if heavy:
        c.add("runs_many", timed(cli(root / f"{c.kind}-{c.n}-x{runs}", "runs", src=src), 1))
        c.add("first_frame", first_frame(c.home, c.name))
    crashed = root / f"{c.kind}-{c.n}-crashed"
    if crashed.exists():
        cd = crashed / "runs" / c.name
        c.res["crash_tail"] = float(replay.load(cd, store.fold_of(rec)).tail_records)
        c.add("crash_status_cli", timed(cli(crashed, "status", c.name, "--json"), 1))
        c.add("crash_status_inproc", timed(lambda: store.load_state(cd), 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,1000000,10000000", help="step records per new-format run")
    ap.add_argument("--legacy-sizes", default="10000,1000000", help="step records per run journaled as today")
    ap.add_argument("--runs", type=int, default=30, help="runs that `trainroom runs` lists")
    ap.add_argument("--repeat", type=int, default=7, help="rounds (each reads every run once, in turn)")
    ap.add_argument("--ranks", type=int, default=RANKS)
    ap.add_argument("--rate", type=float, default=RATE, help="steps per second per rank (simulated)")
    ap.add_argument("--keep", action="store_true", help="keep the state dirs (printed)")
    ap.add_argument(
        "--today-src",
        help="the src/ of a checkout from before this change: `today` rows run its CLI "
        "(git archive OLD_COMMIT src | tar -x -C /tmp/old; --today-src /tmp/old/src)",
    )
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    legacy = [int(x) for x in args.legacy_sizes.split(",") if x]
    root = Path(tempfile.mkdtemp(prefix="trlong", dir="/tmp"))
    policy = JournalPolicy()
    cases: list[Case] = []
    try:
        for kind, n in [("new", n) for n in sizes] + [("today", n) for n in legacy]:
            home = root / f"{kind}-{n}"
            name = f"20260101-000000-{kind}-{n}"
            made = (
                write_new(home, name, n, policy, args.ranks, args.rate)
                if kind == "new"
                else write_legacy(home, name, n, args.ranks, args.rate)
            )
            c = Case(kind, n, home, name, made)
            for i in range(args.runs):
                clone(c.run_dir, root / f"{kind}-{n}-x{args.runs}", f"{name}-{i:02d}")
            rec = store.read_record(c.run_dir)
            loaded = replay.load(c.run_dir, store.fold_of(rec))
            c.res["source_tail"] = float(loaded.tail_records)
            print(
                f"{kind:5} {n:>9} records: written in {made['seconds']:.1f} s, "
                f"{made['bytes'] / n:.1f} B/step record, read from {loaded.source} + {loaded.tail_records} records",
                flush=True,
            )
            cases.append(c)
        # Rounds, every run in turn: a machine whose load drifts weighs on all sizes alike.
        for i in range(args.repeat):
            for c in cases:
                slow = c.kind == "today" and c.n > 100_000
                heavy = not slow or i < 2
                _measure_round(c, root, args.runs, args.today_src if c.kind == "today" else None, heavy)
            print(f"round {i + 1} of {args.repeat} done", flush=True)
        _table([(c.kind, c.n, c.medians()) for c in cases], args.runs)
        cost = keeper_cost(root)
        print(
            f"keeper cost per record: bare journal {cost['journal_us']:.1f} µs, JournalWriter "
            f"{cost['writer_us']:.1f} µs (its fold included); the live fold every keeper does "
            f"{cost['live_fold_us']:.1f} µs"
        )
    finally:
        if args.keep:
            print(f"state dirs kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _crash(r: dict[str, float]) -> str:
    if "crash_status_cli" not in r:
        return "(as above)" if r.get("source_tail") else "—"
    return f"{_fmt_s(r['crash_status_cli'])} ({int(r['crash_tail']):,})"


def _table(rows: list[tuple[str, int, dict[str, float]]], runs: int) -> None:
    print()
    print(
        f"| journal | step records | bytes / step record | `status --json` s | load_state s | `runs` (1) s "
        f"| `runs` ({runs}) s | first frame s | load_view s | after kill -9: `status` s (records replayed) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, n, r in rows:
        print(
            f"| {kind} | {n:,} | {r['bytes'] / n:.1f} | {_fmt_s(r['status_cli'])} | {_fmt_s(r['status_inproc'])} "
            f"| {_fmt_s(r['runs_1'])} | {_fmt_s(r['runs_many'])} | {_fmt_s(r['first_frame'])} | {_fmt_s(r['load_view'])} "
            f"| {_crash(r)} |"
        )
    new = {n: r for k, n, r in rows if k == "new"}
    old = {n: r for k, n, r in rows if k == "today"}
    if len(new) >= 2:
        lo, hi = min(new), max(new)
        print(
            f"\nnew: {hi:,} vs {lo:,} records: status x{new[hi]['status_cli'] / new[lo]['status_cli']:.2f}, "
            f"runs x{new[hi]['runs_many'] / new[lo]['runs_many']:.2f}, first frame x{new[hi]['first_frame'] / new[lo]['first_frame']:.2f}"
        )
    for n in sorted(set(new) & set(old)):
        o, w = old[n], new[n]
        print(
            f"{n:,} records, today / new: bytes x{o['bytes'] / w['bytes']:.1f}, status x{o['status_cli'] / w['status_cli']:.1f}, "
            f"runs ({runs}) x{o['runs_many'] / w['runs_many']:.1f}, first frame x{o['first_frame'] / w['first_frame']:.1f}"
        )
    for kind, n, r in rows:
        if kind == "new":
            print(
                f"writer: {n:,} records in {r['seconds']:.1f} s ({r['seconds'] / r['records'] * 1e6:.1f} µs per record)"
            )
    print(msgspec.json.encode({f"{k}-{n}": r for k, n, r in rows}).decode())


if __name__ == "__main__":
    sys.exit(main())
