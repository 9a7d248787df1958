"""Fuzz a real keeper's socket while a real trainer steps under it, and report what it cost.

    python scripts/fuzz_keeper.py [--seconds 30] [--seed 1] [--json]

A keeper (under a throwaway TRAINROOM_HOME) runs an instrumented stepper; meanwhile this script, as
a hostile same-uid peer, opens connection after connection and sends: random bytes, frames with
absurd length headers, half frames left hanging, valid msgpack of the wrong shape, trainer messages
with mutated fields (negative steps, NaN times, huge strings, wrong types), Hellos that lie about
their pid or claim a rank (refused: the fuzzer is no process of the run), and client requests for
unknown actions or with bad arguments. At the end it reports frames and connections sent, whether
the keeper is alive and still answers `status`, whether the trainer kept stepping, the keeper's RSS
and open fds before and after, and what the journal grew by. Then two hostile hosts' cases: 300
idle live subscriptions from one process (the keeper's RSS with them, and the latency of a `kill`
plan under them), and a run whose journal is a FIFO (how long `runs` and its `status` take).

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
import struct
import sys
import tempfile
import textwrap
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


def idle_subscriptions(sock: str, keeper: int, n: int = 300) -> dict[str, Any]:
    """`n` live subscriptions that never read, from this one process: the keeper's RSS with them
    open, and how long a `kill` plan takes under them (per-peer caps: it must get through)."""
    from trainroom.core import protocol as p

    rss0 = psutil.Process(keeper).memory_info().rss
    quiet = _plan_latency(sock)
    idle: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            s.connect(sock)
            s.sendall(p.frame(p.Subscribe(client="idle", live=True)))
            idle.append(s)
        except OSError:
            s.close()
    time.sleep(1.0)  # let the keeper take them in (and refuse what is over the caps)
    loaded = _plan_latency(sock)
    rss1 = psutil.Process(keeper).memory_info().rss
    held = len(psutil.Process(keeper).net_connections(kind="unix"))
    for s in idle:
        s.close()
    return {
        "subscriptions": n,
        "keeper_connections_held": held,
        "rss_before_bytes": rss0,
        "rss_with_them_bytes": rss1,
        "kill_plan_s_quiet": quiet,
        "kill_plan_s_under_them": loaded,
    }


def fifo_journal(run_dir: str) -> dict[str, Any]:
    """A second run whose journal is a FIFO beside the real one: how long `runs` and that run's
    `status` take (a FIFO read plainly would block both for ever)."""
    from trainroom.core.cli.show import _runs_rows
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import read_run

    src = Path(run_dir)
    fake = src.with_name(src.name + "-fifo")
    fake.mkdir(mode=0o700)
    shutil.copy(src / runs.RECORD_NAME, fake / runs.RECORD_NAME)
    os.mkfifo(fake / runs.JOURNAL_NAME)
    t0 = time.monotonic()
    rows = _runs_rows()
    listed = time.monotonic() - t0
    t0 = time.monotonic()
    try:
        read_run(
            runs.RunInfo(run_id=fake.name, run_dir=str(fake), sock="", created=0.0, argv=[], alive=False)
        )
        said = "read"
    except runs.RunError as exc:
        said = str(exc)
    status_s = time.monotonic() - t0
    shutil.rmtree(fake)
    return {"runs_listed": len(rows), "runs_s": listed, "status_s": status_s, "status_said": said}


def fuzz(seconds: float, seed: int) -> dict[str, Any]:
    from trainroom.core.run import store as runs
    from trainroom.core.run.launch import launch
    from trainroom.core.settings import LaunchOptions

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
        fifo = fifo_journal(info.run_dir)
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
    args = ap.parse_args()
    r = fuzz(args.seconds, args.seed)
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
            print(
                f"{i['subscriptions']} idle subscriptions: keeper holds {i['keeper_connections_held']} connections, "
                f"RSS {i['rss_before_bytes'] / mib:.1f} -> {i['rss_with_them_bytes'] / mib:.1f} MiB; kill plan "
                f"{_secs(i['kill_plan_s_quiet'])} quiet, {_secs(i['kill_plan_s_under_them'])} under them"
            )
        print(
            f"FIFO journal: runs in {f['runs_s']:.2f} s, its status in {f['status_s']:.2f} s ({f['status_said']})"
        )
    i = r["idle_subscriptions"]
    ok = r["keeper_alive"] and r["status_answers"] and r["steps_advanced"] > 0
    ok = ok and bool(i) and i["kill_plan_s_under_them"] is not None
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
