"""What hostile trainer output costs a real keeper, one run per input.

    python scripts/fuzz_trainer_text.py [--json] [--only CASE ...]
    (also run by `python scripts/fuzz_keeper.py`, after its socket fuzz)

Each case launches an instrumented stepper (50 steps a second) under a real keeper in a throwaway
TRAINROOM_HOME; after 20 steps the trainer does the hostile thing and steps on: 1 MiB on one line
with no newline (digits, path characters, underscores), 1000 lines behind a `[rank3]:` prefix in a
single-process run, one `iter 999999999` nanoGPT line, a FIFO put in place of trainer.log, a
"billion laughs" checkpoint (a 2 KB pickle of 2^30 shared paths, through `save_checkpoint`), or an
exception whose text holds NUL bytes (it dies by it). Then, over a 5 s window: a snapshot's and a
`kill` plan's latency (median and worst of 5), the steps the keeper folded (its tick kept pace),
its CPU time and RSS; then (where the trainer still lives) a SIGKILL of the trainer and how long
the keeper takes to say it died, and what it said. A quiet case (nothing hostile) is the baseline. Each case runs twice: the trainer
reporting through the SDK, and printing only nanoGPT's `iter N: loss ...` lines (no SDK: the keeper
reads its steps, ranks and cause from the log alone).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

MIB = 1 << 20
TRAINER = """
    import os, sys, time
    from trainroom.core import sdk
    case, mode = sys.argv[1], sys.argv[2]
    rep = sdk.connect(lr=1e-3) if mode == "sdk" else None
    MIB = 1 << 20

    def hostile():
        if case == "digits":
            sys.stdout.write("1" * MIB)
        elif case == "path-chars":
            sys.stdout.write(("/usr/lib/a.b-c_d" * (MIB // 16)))
        elif case == "underscores":
            sys.stdout.write("_" * MIB)
        elif case == "rank3-prefix":
            for i in range(1000):
                sys.stdout.write(f"[rank3]: step {i} loss 2.5\\n")
        elif case == "iter-999999999":
            sys.stdout.write("iter 999999999: loss 2.3456, time 12.34ms, mfu 1.00%\\n")
        elif case == "billion-laughs":
            import torch
            node = [torch.ones(4)]
            for _ in range(30):
                node = [node, node]
            sdk.save_checkpoint({"model": {"w": torch.zeros(3, 3)}, "laughs": node}, 20)
        elif case == "nul-exception":
            raise RuntimeError("CUDA error\\x00\\x00: device-side assert\\x00 triggered")
        sys.stdout.flush()

    step = 0
    while True:
        step += 1
        if rep is not None:
            rep.step(step, loss=2.0, tokens=step * 64)
        else:  # nanoGPT's line: the keeper reads the steps from the log
            print(f"iter {step}: loss 2.0000, time 20.00ms, mfu 1.00%", flush=True)
        if step == 20 and case != "quiet":
            hostile()
        time.sleep(0.02)
"""
CASES = (
    "quiet",
    "digits",
    "path-chars",
    "underscores",
    "rank3-prefix",
    "iter-999999999",
    "fifo-log",
    "billion-laughs",
    "nul-exception",
)
# Each also with no SDK (mode "log"): the steps, the ranks and the cause read from the log only.
MODES = ("sdk", "log")
WINDOW_S = 5.0


def _status(run_id: str) -> dict[str, Any]:
    from trainroom.core.run import store as runs
    from trainroom.core.run.client import current_state
    from trainroom.core.run.status import status_dict

    st, alive = current_state(runs.resolve_run(run_id))
    return status_dict(st, keeper_alive=alive)


class GaveUp(Exception):
    pass


def _wait(what: str, fn: Any, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise GaveUp(f"gave up after {timeout:.0f} s waiting for {what}")


def one(case: str, mode: str, work: Path) -> dict[str, Any]:
    from fuzz_keeper import _latencies  # type: ignore[import-not-found]

    from trainroom.core.configuration.settings import LaunchOptions
    from trainroom.core.run import store as runs
    from trainroom.core.run.launch import launch

    script = work / "trainer.py"
    script.write_text(textwrap.dedent(TRAINER))
    info = launch(
        [sys.executable, str(script), case, mode],
        LaunchOptions(linger_s=30, ckpt_root=str(work / f"ck-{case}")),
        cwd=str(work),
    )
    out: dict[str, Any] = {"case": case, "mode": mode}
    try:
        keeper = _wait("the keeper", lambda: runs.read_record(Path(info.run_dir)).keeper_pid)
        _wait("step 25", lambda: (_status(info.run_id)["step"] or 0) >= 25 or (case == "nul-exception" and 1))
        if case == "fifo-log":
            log = Path(info.run_dir) / "trainer.log"
            log.rename(log.with_name("trainer.log.moved"))
            os.mkfifo(log)
        proc = psutil.Process(keeper)
        cpu0, step0, t0 = sum(proc.cpu_times()[:2]), _status(info.run_id)["step"] or 0, time.monotonic()
        lat = _latencies(info.sock)
        time.sleep(max(0.0, WINDOW_S - (time.monotonic() - t0)))
        d = _status(info.run_id)
        span = time.monotonic() - t0
        out |= {
            "snapshot_s": lat["snapshot_s"],
            "snapshot_max_s": lat["snapshot_max_s"],
            "kill_plan_s": lat["kill_plan_s"],
            "kill_plan_max_s": lat["kill_plan_max_s"],
            "steps_folded_per_s": round(((d["step"] or 0) - step0) / span, 1),
            "keeper_cpu_percent": round(100 * (sum(proc.cpu_times()[:2]) - cpu0) / span, 1),
            "keeper_rss_bytes": proc.memory_info().rss,
            "ranks": sorted(r["rank"] for r in d["ranks"]),
            "checkpoints": [(c["step"], c["state"]) for c in d["checkpoints"]],
            "notes": [n.get("text") or n.get("message") for n in d.get("notes", [])][-3:],
        }
        if case == "billion-laughs":  # how long its verification took, the keeper answering meanwhile

            def judged() -> list[Any]:
                return [
                    c for c in _status(info.run_id)["checkpoints"] if c["state"] in ("verified", "rejected")
                ]

            got = _wait("the checkpoint's verdict", judged)
            out["checkpoints"] = [(c["step"], c["state"]) for c in got]
            out["verdict_after_s"] = round(time.monotonic() - t0, 2)
        pid = d["pid"]
        if pid and d["ended_s_ago"] is None:
            os.kill(pid, signal.SIGKILL)
            k0 = time.monotonic()
            dead = _wait(
                "the keeper to see the death", lambda: _status(info.run_id)["ended_s_ago"] is not None and 1
            )
            out["death_seen_s"] = round(time.monotonic() - k0, 2) if dead else None
        found = _status(info.run_id)["findings"]
        out["dead"] = next((f["message"] for f in found if f["code"] == "DEAD"), None)
    except GaveUp as exc:
        out["gave_up"] = str(exc)
    finally:
        runs.stop_run(info.run_dir)
    print(f"fuzz_trainer_text: {case} ({mode}) done", file=sys.stderr, flush=True)
    return out


def run_all(cases: tuple[str, ...] = CASES, modes: tuple[str, ...] = MODES) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="trtext"))
    old = os.environ.get("TRAINROOM_HOME")
    os.environ["TRAINROOM_HOME"] = str(work / "home")
    try:
        return [one(c, m, work) for m in modes for c in cases if not (m == "log" and c == "billion-laughs")]
    finally:
        if old is None:
            os.environ.pop("TRAINROOM_HOME", None)
        else:
            os.environ["TRAINROOM_HOME"] = old
        shutil.rmtree(work, ignore_errors=True)


def _ms(v: float | None) -> str:
    return "refused" if v is None else f"{v * 1000:.0f} ms"


def lines(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in results:
        if "gave_up" in r:
            out.append(f"{r['case']} ({r['mode']}): {r['gave_up']}")
            continue
        death = f"; SIGKILL seen in {r['death_seen_s']:.2f} s" if r.get("death_seen_s") is not None else ""
        out.append(
            f"{r['case']} ({r['mode']}): snapshot {_ms(r['snapshot_s'])} (worst {_ms(r['snapshot_max_s'])}), kill plan "
            f"{_ms(r['kill_plan_s'])} (worst {_ms(r['kill_plan_max_s'])}); {r['steps_folded_per_s']} steps/s "
            f"folded, keeper CPU {r['keeper_cpu_percent']} %, RSS {r['keeper_rss_bytes'] / MIB:.1f} MiB; "
            f"ranks {r['ranks']}{death}"
        )
        if r.get("dead"):
            out.append(f"  DEAD: {r['dead'][:160]}")
        if r["case"] == "billion-laughs":
            out.append(f"  checkpoints: {r['checkpoints']}, verdict {r['verdict_after_s']} s after step 25")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", nargs="+", choices=CASES)
    ap.add_argument("--mode", choices=MODES, help="only this mode (default: both)")
    a = ap.parse_args()
    results = run_all(tuple(a.only) if a.only else CASES, (a.mode,) if a.mode else MODES)
    print(json.dumps(results, indent=2) if a.json else "\n".join(lines(results)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
