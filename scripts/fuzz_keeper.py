"""Fuzz a real keeper's socket while a real trainer steps under it, and report what it cost.

    python scripts/fuzz_keeper.py [--seconds 30] [--seed 1] [--json]

A keeper (under a throwaway TRAINROOM_HOME) runs an instrumented stepper; meanwhile this script, as
a hostile same-uid peer, opens connection after connection and sends: random bytes, frames with
absurd length headers, half frames left hanging, valid msgpack of the wrong shape, trainer messages
with mutated fields (negative steps, NaN times, huge strings, wrong types), Hellos that lie about
their pid or claim a rank (refused: the fuzzer is no process of the run), and client requests for
unknown actions or with bad arguments. At the end it reports frames and connections sent, whether
the keeper is alive and still answers `status`, whether the trainer kept stepping, the keeper's RSS
and open fds before and after, and what the journal grew by. Then the hostile hosts' cases: 100, 300
and 1000 idle live subscriptions, from one process and spread over ten (the keeper's RSS with them
and after them, and the latency of a `kill` plan and of a snapshot under them), and runs whose
journal is a FIFO, a directory or 32 MiB of zeros (how long `runs` and each `status` take, and the
live keeper's RSS and action latency while they are listed over and over). Last, the hostile
trainer output (scripts/fuzz_trainer_text.py: 1 MiB lines with no newline, a FIFO at
trainer.log, a billion-laughs checkpoint, `[rank3]:` prefixes, `iter 999999999`, NUL bytes in an
exception), one run each, with and without the SDK (`--no-text` skips them).

What a healthy keeper shows: alive, status answers, steps advanced at the stepper's pace (50 a
second; a Hello taken from the fuzzer would hold the run's step, the slowest rank's, back), RSS and
fds back near where they began (the per-connection caps hold), the journal grown by counted
refusals, not a record per frame.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil

STEPPER = """
    import time
    from trainroom.core import sdk
    rep = sdk.connect(lr=1e-3)
    step = 0
    while True:
        step += 1
        rep.step(step, loss=2.0, tokens=step * 64)
        time.sleep(0.02)
"""

HEADER = struct.Struct(">I")


def _frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _mutated_trainer_msg(rng: random.Random) -> bytes:
    absurd: list[Any] = [-1, -(2**63), 2**64 - 1, float("nan"), float("inf"), "x" * 70000, None, [], {}, True]
    shapes: list[dict[str, Any]] = [
        {"type": "step", "step": rng.choice([*absurd, 5]), "t": rng.choice([*absurd, time.time()])},
        {
            "type": "hello",
            "pid": rng.choice([1, os.getpid(), -5, 2**40]),
            "rank": rng.choice([0, 1, -1, 2**40]),
        },
        {"type": "heartbeat", "t": rng.choice(absurd)},
        {"type": "note", "kind": "x" * rng.randint(0, 600), "data": {"k": "v" * rng.randint(0, 20000)}},
        {
            "type": "checkpoint",
            "path": rng.choice(["/etc/passwd", "../../x", "a" * 5000]),
            "step": rng.choice(absurd),
        },
        {"type": "crash", "chain": rng.choice(absurd)},
        {"type": rng.choice(["nope", "", "step" * 50]), "step": 1},
        {
            "type": "request",
            "id": 1,
            "action": rng.choice(["kill", "rm -rf", "x" * 300]),
            "args": {"grace_s": "nan"},
        },
    ]
    return msgspec.msgpack.encode(rng.choice(shapes))


def _payload(rng: random.Random) -> tuple[bytes, int, bool]:
    """(bytes to send, frames in it, leave the connection hanging open)."""
    kind = rng.randrange(6)
    if kind == 0:  # random bytes
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4096))), 1, False
    if kind == 1:  # an absurd length header
        return HEADER.pack(rng.choice([2**31, 2**32 - 1, 64 << 20])) + b"\x00" * 64, 1, False
    if kind == 2:  # a half frame, left hanging (slow loris)
        return HEADER.pack(1 << 20) + b"\x00" * rng.randint(0, 1000), 1, True
    if kind == 3:  # valid msgpack of the wrong shape
        return _frame(msgspec.msgpack.encode(rng.choice([1, "x", [1, 2], {"a": 1}, None]))), 1, False
    n = rng.randint(1, 50)  # a burst of mutated messages
    return b"".join(_frame(_mutated_trainer_msg(rng)) for _ in range(n)), n, False


def _usage(pid: int) -> dict[str, int]:
    proc = psutil.Process(pid)
    return {"rss_bytes": proc.memory_info().rss, "fds": proc.num_fds()}


def _status(run_id: str) -> dict[str, Any]:
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import current_state
    from trainroom.core.run.status import status_dict

    info = runs.resolve_run(run_id)
    st, alive = current_state(info)
    return status_dict(st, keeper_alive=alive)


def _plan_latency(sock: str) -> float | None:
    """Seconds a `kill` plan (the request half of a kill, nothing signalled) takes; None: refused."""
    from trainroom.core.run.client import KeeperClient, KeeperGone

    t0 = time.monotonic()
    try:
        reply = KeeperClient(sock).call("kill", {"grace_s": 1.0}, confirm=False, timeout_s=30)
    except (KeeperGone, OSError):
        return None
    return time.monotonic() - t0 if reply.stage == "plan" else None


def _latencies(sock: str, tries: int = 5) -> dict[str, float | None]:
    """A `kill` plan and a snapshot (what `status` asks), `tries` times: median and worst."""
    from trainroom.core.run.client import KeeperClient, KeeperGone

    plans = [_plan_latency(sock) for _ in range(tries)]
    snaps: list[float | None] = []
    for _ in range(tries):
        t0 = time.monotonic()
        try:
            client = KeeperClient(sock, timeout_s=30)
            try:
                client.subscribe(client="fuzz-status", live=False)
            finally:
                client.close()
            snaps.append(time.monotonic() - t0)
        except (KeeperGone, OSError):
            snaps.append(None)
    got = [x for x in plans if x is not None]
    snap = [x for x in snaps if x is not None]
    return {
        "kill_plan_s": statistics.median(got) if len(got) == tries else None,
        "kill_plan_max_s": max(got) if len(got) == tries else None,
        "snapshot_s": statistics.median(snap) if len(snap) == tries else None,
        "snapshot_max_s": max(snap) if len(snap) == tries else None,
    }


HOLDER = """
import socket, sys
from trainroom.core.wire import protocol as p
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(sys.argv[1])
        s.sendall(p.frame(p.Subscribe(client="idle", live=True)))
        held.append(s)
    except OSError:
        s.close()
print(len(held), flush=True)
sys.stdin.read()
"""


def idle_subscriptions(sock: str, keeper: int, counts: tuple[int, ...] = (100, 300, 1000)) -> dict[str, Any]:
    """Live subscriptions that never read, `n` from this one process, then `n` spread over 10
    processes (the per-peer cap does not hold those back: the keeper's own bounds must): with
    each, the keeper's RSS, the connections it holds, and how long a `kill` plan and a snapshot
    take (median and worst of 5) while the trainer steps and the keeper's deltas pile up in
    sockets nobody reads; then its RSS once they are gone."""
    from trainroom.core.wire import protocol as p

    proc = psutil.Process(keeper)
    out: dict[str, Any] = {"quiet": _latencies(sock), "rss_quiet_bytes": proc.memory_info().rss, "cases": []}
    for n in counts:
        for spread in (1, 10):
            holders: list[subprocess.Popen[str]] = []
            idle: list[socket.socket] = []
            if spread == 1:
                for _ in range(n):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.settimeout(2.0)
                    try:
                        s.connect(sock)
                        s.sendall(p.frame(p.Subscribe(client="idle", live=True)))
                        idle.append(s)
                    except OSError:
                        s.close()
                opened = len(idle)
            else:
                holders = [
                    subprocess.Popen(
                        [sys.executable, "-c", HOLDER, sock, str(n // spread)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    for _ in range(spread)
                ]
                opened = sum(int((h.stdout.readline() if h.stdout else "0") or 0) for h in holders)
            time.sleep(3.0)  # the trainer steps on: deltas queue for subscribers that never read
            case: dict[str, Any] = {
                "subscriptions": n,
                "peers": spread,
                "opened": opened,
                "keeper_connections_held": len(proc.net_connections(kind="unix")),
                "rss_with_them_bytes": proc.memory_info().rss,
                **_latencies(sock),
            }
            for s in idle:
                s.close()
            for h in holders:
                if h.stdin is not None:
                    h.stdin.close()
                h.wait(timeout=30)
            time.sleep(2.0)  # the keeper notices the closes and lets their queues go
            case["rss_after_bytes"] = proc.memory_info().rss
            out["cases"].append(case)
    return out


def _hostile_journals(run_dir: str) -> list[Path]:
    """Three runs beside the real one whose journal is a FIFO, a directory, 32 MiB of zeros."""
    from trainroom.core.run import store as runs

    src = Path(run_dir)
    made: list[Path] = []
    for kind in ("fifo", "dir", "zeros"):
        fake = src.with_name(f"{src.name}-{kind}")
        fake.mkdir(mode=0o700)
        shutil.copy(src / runs.RECORD_NAME, fake / runs.RECORD_NAME)
        journal = fake / runs.JOURNAL_NAME
        if kind == "fifo":
            os.mkfifo(journal)
        elif kind == "dir":
            journal.mkdir()
        else:
            with open(journal, "wb") as f:
                f.truncate(32 << 20)
        made.append(fake)
    return made


def fifo_journal(run_dir: str, sock: str, keeper: int) -> dict[str, Any]:
    """Runs whose journal is a FIFO, a directory or 32 MiB of zeros beside the real one: how long
    `runs` and each one's `status` take (a FIFO read plainly would block both for ever), and the
    live keeper's RSS and action latency while `runs` lists them over and over."""
    from trainroom.core.cli.show import _runs_rows
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import read_run

    made = _hostile_journals(run_dir)
    out: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        rows = _runs_rows()
        out |= {"runs_listed": len(rows), "runs_s": time.monotonic() - t0, "status": {}}
        for fake in made:
            t0 = time.monotonic()
            try:
                read_run(
                    runs.RunInfo(
                        run_id=fake.name, run_dir=str(fake), sock="", created=0.0, argv=[], alive=False
                    )
                )
                said = "read"
            except runs.RunError as exc:
                said = str(exc)
            out["status"][fake.name.rsplit("-", 1)[1]] = {"s": time.monotonic() - t0, "said": said}
        stop = threading.Event()
        listings = [0]

        def lister() -> None:
            while not stop.is_set():
                _runs_rows()
                listings[0] += 1

        th = threading.Thread(target=lister, daemon=True)
        th.start()
        try:
            time.sleep(1.0)
            out |= {"rss_under_them_bytes": psutil.Process(keeper).memory_info().rss, **_latencies(sock)}
        finally:
            stop.set()
            th.join(60)
        out["listings_meanwhile"] = listings[0]
    finally:
        for fake in made:
            shutil.rmtree(fake, ignore_errors=True)
    return out


def fuzz(seconds: float, seed: int) -> dict[str, Any]:
    from trainroom.core.configuration.settings import LaunchOptions
    from trainroom.core.run import store as runs
    from trainroom.core.run.launch import launch

    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="trfuzz"))
    os.environ["TRAINROOM_HOME"] = str(work / "home")
    script = work / "stepper.py"
    script.write_text(textwrap.dedent(STEPPER))
    info = launch([sys.executable, str(script)], LaunchOptions(linger_s=30), cwd=str(work))
    try:
        deadline = time.monotonic() + 60
        while not (_status(info.run_id)["step"] or 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        record = runs.read_record(Path(info.run_dir))
        keeper = record.keeper_pid
        assert keeper is not None, "the keeper did not name itself"
        journal = Path(info.run_dir) / runs.JOURNAL_NAME
        before = _usage(keeper) | {
            "journal_bytes": journal.stat().st_size,
            "step": _status(info.run_id)["step"],
        }
        frames = conns = refused_connects = 0
        hanging: list[socket.socket] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            data, n, hang = _payload(rng)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1.0)
            try:
                s.connect(info.sock)
                s.sendall(data)
                conns += 1
                frames += n
            except OSError:
                refused_connects += 1
                s.close()
                continue
            if hang and len(hanging) < 400:
                hanging.append(s)
            else:
                s.close()
        for s in hanging:
            s.close()
        time.sleep(2.0)  # let the keeper close what we left
        alive = psutil.pid_exists(keeper)
        idle = idle_subscriptions(info.sock, keeper) if alive else {}
        fifo = fifo_journal(info.run_dir, info.sock, keeper)
        alive = psutil.pid_exists(keeper)
        after_status = _status(info.run_id) if alive else {}
        after = (_usage(keeper) if alive else {}) | {
            "journal_bytes": journal.stat().st_size,
            "step": after_status.get("step"),
        }
        return {
            "seconds": seconds,
            "seed": seed,
            "connections": conns,
            "frames_sent": frames,
            "connects_refused": refused_connects,
            "keeper_alive": alive,
            "status_answers": bool(after_status),
            "state": after_status.get("state"),
            "steps_advanced": (after["step"] or 0) - (before["step"] or 0),
            "before": before,
            "after": after,
            "idle_subscriptions": idle,
            "fifo_journal": fifo,
        }
    finally:
        from trainroom.core.run.store import stop_run

        stop_run(info.run_dir)
        shutil.rmtree(work, ignore_errors=True)


def _secs(v: float | None) -> str:
    return "refused" if v is None else f"{v * 1000:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-text", action="store_true", help="skip the hostile trainer output")
    args = ap.parse_args()
    r = fuzz(args.seconds, args.seed)
    if not args.no_text:
        from fuzz_trainer_text import run_all

        r["trainer_text"] = run_all()
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        mib = 1 << 20
        b, a = r["before"], r["after"]
        print(
            f"{r['connections']} connections, {r['frames_sent']} frames in {r['seconds']:.0f} s (seed {r['seed']})"
        )
        print(f"keeper alive: {r['keeper_alive']}; status answers: {r['status_answers']} ({r['state']})")
        print(f"trainer steps during the fuzz: {r['steps_advanced']}")
        if a.get("rss_bytes"):
            print(
                f"keeper RSS {b['rss_bytes'] / mib:.1f} -> {a['rss_bytes'] / mib:.1f} MiB; fds {b['fds']} -> {a['fds']}"
            )
        print(f"journal {b['journal_bytes'] / mib:.2f} -> {a['journal_bytes'] / mib:.2f} MiB")
        i, f = r["idle_subscriptions"], r["fifo_journal"]
        if i:
            q = i["quiet"]
            print(
                f"quiet: RSS {i['rss_quiet_bytes'] / mib:.1f} MiB; kill plan {_secs(q['kill_plan_s'])} "
                f"(worst {_secs(q['kill_plan_max_s'])}), snapshot {_secs(q['snapshot_s'])}"
            )
            for c in i["cases"]:
                print(
                    f"{c['subscriptions']} idle subscriptions from {c['peers']} peer(s) ({c['opened']} opened): "
                    f"keeper holds {c['keeper_connections_held']} connections, RSS "
                    f"{c['rss_with_them_bytes'] / mib:.1f} MiB with them, {c['rss_after_bytes'] / mib:.1f} MiB after; "
                    f"kill plan {_secs(c['kill_plan_s'])} (worst {_secs(c['kill_plan_max_s'])}), "
                    f"snapshot {_secs(c['snapshot_s'])} (worst {_secs(c['snapshot_max_s'])})"
                )
        said = ", ".join(f"{k} {v['s']:.2f} s" for k, v in f["status"].items())
        print(f"hostile journals: runs in {f['runs_s']:.2f} s; status of each: {said}")
        print(
            f"  while `runs` lists them ({f['listings_meanwhile']} times): keeper RSS "
            f"{f['rss_under_them_bytes'] / mib:.1f} MiB, kill plan {_secs(f['kill_plan_s'])} "
            f"(worst {_secs(f['kill_plan_max_s'])}), snapshot {_secs(f['snapshot_s'])}"
        )
        if "trainer_text" in r:
            from fuzz_trainer_text import lines

            print("hostile trainer output (one run each):")
            print("\n".join("  " + ln for ln in lines(r["trainer_text"])))
    i = r["idle_subscriptions"]
    ok = r["keeper_alive"] and r["status_answers"] and r["steps_advanced"] > 0
    ok = ok and bool(i) and all(c["kill_plan_s"] is not None for c in i["cases"])
    ok = ok and r["fifo_journal"]["kill_plan_s"] is not None
    ok = ok and all("gave_up" not in t and t["kill_plan_s"] is not None for t in r.get("trainer_text", []))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
