"""The watchdog end to end (scenarios 1, 2, 3, 9, 10, 13, 14): a real keeper, the demo
trainer or a small script as real processes, real signals, real locks; NVML through the fake at
the pynvml boundary (the machine has no GPU), driven by the demo trainer from its own process.

Each test waits on what the keeper says (generous bounds: torch starts slowly on a loaded
machine) and then checks the journal, so a finding raised and cleared in between is seen too.
How fast each verdict comes is measured by scripts/bench_detect.py, not asserted here.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

TORCH_START_S = 120.0  # torch import + model set-up on 2 busy cores, with margin
# Every code the watchdog can raise: a healthy run raises none of them.
WATCHDOG_CODES = {
    "DEAD",
    "STALLED",
    "HUNG",
    "SLOW",
    "REPEAT_DEATH",
    "GHOST_MEMORY",
    "ORPHAN_CONTEXT",
    "HOST_RAM_LOW",
    "STALE_LOCK",
    "DUPLICATE_TRAINER",
    "MASKED_ERROR",
}


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _raised(info: runs.RunInfo) -> list[Any]:
    return [r.finding for r in _journal(info) if isinstance(r, protocol.FindingRaised)]


def _states(info: runs.RunInfo) -> list[str]:
    return [r.state for r in _journal(info) if isinstance(r, protocol.RunStatus)]


def _finding(d: dict[str, Any], code: str) -> dict[str, Any] | None:
    return next((f for f in d["findings"] if f["code"] == code), None)


def _wait_finding(
    info: runs.RunInfo, code: str, timeout: float = TORCH_START_S
) -> tuple[dict[str, Any], dict[str, Any]]:
    d = wait_for(lambda: (s := status(info)) and _finding(s, code) and s, timeout=timeout, what=code)
    f = _finding(d, code)
    assert f is not None
    return d, f


def _wait_state(info: runs.RunInfo, state: str, timeout: float = TORCH_START_S) -> dict[str, Any]:
    return wait_for(
        lambda: (s := status(info))["state"] == state and s, timeout=timeout, what=f"state {state}"
    )


def _launch_script(tmp_path: Path, source: str) -> runs.RunInfo:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    return launch([sys.executable, str(script)], {"linger_s": 60}, cwd=str(tmp_path))


# --------------------------------------------------------------------------- 1 silent-death


def test_silent_death_is_dead_with_signal_last_step_and_steps_lost_since_the_verified_checkpoint(
    trhome: Path,
) -> None:
    info = start_demo(fault="silent-death", fault_step=25, ckpt_every=10, step_delay=0.02)
    d = _wait_state(info, "dead")
    assert d["exit"]["signal_name"] == "SIGKILL" and d["step"] == 25
    # The checkpoints of steps 10 and 20 are verified in a subprocess; DEAD follows as they are.
    d, dead = wait_for(
        lambda: (
            (s := status(info))
            and (f := _finding(s, "DEAD"))
            and f["evidence"]["last_verified_step"] == 20
            and (s, f)
        ),
        timeout=TORCH_START_S,
        what="DEAD counting from the verified step-20 checkpoint",
    )
    assert dead["severity"] == "critical" and dead["action"] == "resume"
    ev = dead["evidence"]
    assert ev["signal"] == "SIGKILL" and ev["exit_signal"] == signal.SIGKILL and ev["exit_code"] is None
    assert ev["last_step"] == 25 and ev["steps_lost"] == 5
    assert "killed by SIGKILL at step 25" in dead["message"]
    assert "5 steps lost since the last verified checkpoint (step 20)" in dead["message"]
    assert "no traceback" in dead["message"]
    # Never called anything else on the way: the keeper's waitpid, not a silence, said dead.
    assert set(_states(info)) <= {"starting", "running", "dead"}


# --------------------------------------------------------------------------- 2 stall


def test_stall_is_stalled_with_heartbeats_flowing_and_no_step(trhome: Path) -> None:
    info = start_demo(fault="stall", fault_step=20, step_delay=0.02, ckpt_every=0)
    d = _wait_state(info, "stalled")
    f = _finding(d, "STALLED")
    assert f is not None and f["severity"] == "warning"
    assert f["message"].startswith("alive, heartbeats flowing, no step for ")
    ev = f["evidence"]
    # max(3 x median step interval, 10 s): a 0.02 s step makes the floor the bound.
    assert ev["bound_s"] == 10.0 and ev["last_step"] == 20 and ev["gap_s"] >= 10.0
    assert d["step"] == 20 and d["exit"]["code"] is None
    # The loop still runs (it computes micro-batches): a stall, never a hang.
    assert "HUNG" not in {x.code for x in _raised(info)}
    assert "hung" not in _states(info)


# --------------------------------------------------------------------------- 3 hang


def test_sigstopped_trainer_is_hung_with_continue_as_its_fix(trhome: Path) -> None:
    info = start_demo(fault="hang", fault_step=20, step_delay=0.02, ckpt_every=0)
    d = _wait_state(info, "hung")
    f = _finding(d, "HUNG")
    assert f is not None and f["severity"] == "critical" and f["action"] == "continue"
    assert f["evidence"]["cause"] == "stopped" and f["evidence"]["state"] == "T"
    assert f["evidence"]["pid"] == d["pid"] and f["evidence"]["last_step"] == 20
    assert psutil.Process(d["pid"]).status() == psutil.STATUS_STOPPED
    assert "STALLED" not in {x.code for x in _raised(info)}


def test_a_main_thread_parked_on_a_lock_with_heartbeats_on_is_hung_not_stalled(trhome: Path) -> None:
    info = start_demo(fault="hang-lock", fault_step=20, step_delay=0.02, ckpt_every=0)
    d = _wait_state(info, "hung")
    f = _finding(d, "HUNG")
    assert f is not None and f["action"] == "dump"
    ev = f["evidence"]
    assert ev["cause"] == "main-frame" and ev["main_thread_parked"] is True
    assert "train.py" in ev["main_frame"] and ev["last_step"] == 20
    assert "heartbeats flow but the main thread has sat on" in f["message"]
    # The heartbeat thread went on beating after the last step: this is not a silent process.
    recs = _journal(info)
    last_step_i = max(
        i for i, r in enumerate(recs) if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Step)
    )
    beats = [
        r
        for r in recs[last_step_i:]
        if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Heartbeat)
    ]
    assert len(beats) >= 5
    # Said hung at the step bound, without a STALLED first.
    assert "STALLED" not in {x.code for x in _raised(info)}
    assert "stalled" not in _states(info)


# --------------------------------------------------------------------------- 14 duplicate


def test_duplicate_trainer_names_both_pids(trhome: Path) -> None:
    info = start_demo(fault="duplicate", fault_step=5, step_delay=0.02, ckpt_every=0)
    d, f = _wait_finding(info, "DUPLICATE_TRAINER")
    ours = d["pid"]
    ev = f["evidence"]
    assert ev["kind"] == "trainer" and ev["ours"] == ours and len(ev["others"]) == 1
    other = ev["others"][0]
    assert ev["pids"] == [ours, other] and other != ours
    assert f"pid {other}" in f["message"] and f"ours is pid {ours}" in f["message"]
    # The other one really runs our command in our directory, outside our process group.
    dup = psutil.Process(other)
    assert dup.cmdline() == psutil.Process(ours).cmdline()
    assert os.path.realpath(dup.cwd()) == os.path.realpath(psutil.Process(ours).cwd())
    assert os.getpgid(other) != d["pgid"]


# --------------------------------------------------------------------------- 13 masked-enomem


def test_masked_enomem_shows_the_innermost_errno(trhome: Path) -> None:
    info = start_demo(fault="masked-enomem", fault_step=10, step_delay=0.02, ckpt_every=0)
    d = _wait_state(info, "dead")
    d, f = _wait_finding(info, "MASKED_ERROR", timeout=10)
    assert (
        "`SystemError: readinto` hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f["message"]
    )
    assert f["action"] == "reclaim"
    ev = f["evidence"]
    assert ev["errno_name"] == "ENOMEM" and ev["inner"]["errno"] == errno.ENOMEM
    assert ev["source"] == "reporter"
    dead = _finding(d, "DEAD")
    assert dead is not None and dead["evidence"]["exit_code"] == 1 and dead["evidence"]["last_step"] == 10
    assert "OSError: [Errno 12] Cannot allocate memory" in dead["message"]


@pytest.mark.parametrize("link", ["from", "during"])
def test_uninstrumented_trainer_dying_with_a_chained_traceback_gives_masked_error(
    trhome: Path, tmp_path: Path, link: str
) -> None:
    # No reporter: the keeper reads the last traceback of trainer.log when the trainer dies.
    raise_outer = (
        "raise SystemError('readinto') from exc" if link == "from" else "raise SystemError('readinto')"
    )
    info = _launch_script(
        tmp_path,
        f"""
        import errno, time
        for i in range(0, 40, 10):
            print(f"iter {{i}}: loss {{4.0 - i / 100:.4f}}, time 12.34ms", flush=True)
            time.sleep(0.05)
        def load():
            try:
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            except OSError as exc:
                {raise_outer}
        load()
    """,
    )
    d = _wait_state(info, "dead", timeout=60)
    assert d["instrumented"] is False and d["exit"]["code"] == 1 and d["step"] == 30
    d, f = _wait_finding(info, "MASKED_ERROR", timeout=10)
    assert (
        "`SystemError: readinto` hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f["message"]
    )
    ev = f["evidence"]
    assert ev["source"] == "log" and ev["errno_name"] == "ENOMEM"
    assert ev["chain"] == ["SystemError: readinto", "OSError: [Errno 12] Cannot allocate memory"]


# --------------------------------------------------------------------------- 10 orphan-context


def _lock_inheritor(home: Path) -> psutil.Process:
    """The demo's child that inherited the trainer's flock and outlives it."""
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (p.info["environ"] or {}).get("TRAINROOM_HOME") == str(home) and p.info["cmdline"][-1:] == [
                "import time; time.sleep(3600)"
            ]:
                return p
        except (psutil.Error, TypeError):
            continue
    raise AssertionError("no lock inheritor")


def test_orphan_context_gives_stale_lock_with_the_holder_and_orphan_context(trhome: Path) -> None:
    info = start_demo(fault="orphan-context", fault_step=10, step_delay=0.02, ckpt_every=0)
    d = _wait_state(info, "dead")
    trainer = d["pid"]
    d, lock = _wait_finding(info, "STALE_LOCK", timeout=30)
    inheritor = _lock_inheritor(trhome)
    ev = lock["evidence"]
    assert ev["path"].endswith("train.lock") and ev["kind"] == "FLOCK"
    # /proc/locks names the process that took the lock (the dead trainer); the descriptor lives
    # on in its child, which is what must be killed.
    assert ev["holder_pid"] == trainer and ev["holder_exists"] is False
    assert [k["pid"] for k in ev["inheritors"]] == [inheritor.pid] and ev["kill_pids"] == [inheritor.pid]
    assert ev["inheritors"][0]["state"] in ("S", "R")
    assert f"held by pid {trainer}: pid {trainer} no longer exists" in lock["message"]
    assert f"pid {inheritor.pid} (python, state {ev['inheritors'][0]['state']}" in lock["message"]
    assert lock["action"] == "kill"
    # The fake driver shows a compute pid that does not exist, at 100 % and 60 W.
    ghost_pid = 4_194_000 + trainer % 1000
    d = wait_for(
        lambda: (
            (s := status(info))
            and any(
                # Its kill target (the lock's inheritor) comes from the leftovers scan, which runs
                # at the duplicates' cadence: it may follow the finding by a few probe cycles.
                f["code"] == "ORPHAN_CONTEXT" and f["evidence"].get("pid") == ghost_pid and f["target"]
                for f in s["findings"]
            )
            and s
        ),
        timeout=30,
        what="ORPHAN_CONTEXT for the driver's unknown pid, with the run's leftover as its target",
    )
    orphan = next(
        f for f in d["findings"] if f["code"] == "ORPHAN_CONTEXT" and f["evidence"].get("pid") == ghost_pid
    )
    oev = orphan["evidence"]
    assert oev["exists"] is False and oev["util_percent"] == 100 and oev["power_w"] == 60.0
    assert oev["used_bytes"] == 7 << 30 and oev["previous_pgids"] == [d["pgid"]]
    # What the driver lists fits in the device: the device row never says more used than it has.
    assert oev["device_used_bytes"] <= 12 << 30
    assert orphan["action"] == "kill" and orphan["severity"] == "critical"
    assert (
        f"compute pid {ghost_pid} holding 7.0 GiB" in orphan["message"]
        and "100 %, 60.0 W" in orphan["message"]
    )
    # The busy device with no live process of ours is said too.
    busy = [
        f
        for f in d["findings"]
        if f["code"] == "ORPHAN_CONTEXT" and "device" in f["evidence"] and f["evidence"].get("pid") is None
    ]
    assert (
        busy
        and busy[0]["evidence"]["util_percent"] == 100
        and ghost_pid in busy[0]["evidence"]["driver_pids"]
    )
    assert "with 11.3 GiB of 12.0 GiB used" in busy[0]["message"]
    # One cause, one row: the contexts left behind are counted, the newest said.
    rows = [r for r in d["finding_rows"] if r["code"] == "ORPHAN_CONTEXT"]
    assert len(rows) == 1 and rows[0]["count"] == len(
        [f for f in d["findings"] if f["code"] == "ORPHAN_CONTEXT"]
    )


# --------------------------------------------------------------------------- 9 ghost-memory


def test_ghost_memory_gives_both_figures_and_the_ratio_after_two_probe_cycles(trhome: Path) -> None:
    info = start_demo(fault="ghost-memory", fault_step=10, step_delay=0.05, ckpt_every=0)
    d, f = _wait_finding(info, "GHOST_MEMORY")
    ev = f["evidence"]
    reserved = 4 << 30
    assert ev["reserved_bytes"] == reserved and ev["driver_bytes"] == int(reserved * 2.1)
    assert ev["ratio"] == pytest.approx(2.1, abs=0.001) and ev["basis"] == "per-process"
    assert "the driver attributes 8.4 GiB but the allocator reserves 4.0 GiB (2.10x > 1.5x" in f["message"]
    assert d["vram"]["allocator_reserved_bytes"] == reserved
    # Raised on the second probe cycle that saw it, and not before the fault.
    first = next(x for x in _raised(info) if x.code == "GHOST_MEMORY")
    assert first.evidence["cycles"] == 2
    recs = _journal(info)
    raised_i = next(
        i
        for i, r in enumerate(recs)
        if isinstance(r, protocol.FindingRaised) and r.finding.code == "GHOST_MEMORY"
    )
    steps_before = [
        r.msg.step
        for r in recs[:raised_i]
        if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Step)
    ]
    assert max(steps_before) >= 10


# --------------------------------------------------------------------------- no false finding


def test_a_checkpoint_save_longer_than_the_stall_bound_raises_no_stall(trhome: Path, tmp_path: Path) -> None:
    info = _launch_script(
        tmp_path,
        """
        import time
        from trainroom.core import sdk
        rep = sdk.connect(lr=1e-3)
        step = 0
        def steps(n):
            global step
            for _ in range(n):
                time.sleep(0.02)
                step += 1
                rep.step(step, loss=2.0, tokens=step * 512)
        steps(30)
        with rep.phase("checkpoint-save"):
            time.sleep(13.0)  # the stall bound is max(3 x 0.02 s, 10 s)
        steps(20)
        rep.close()
    """,
    )
    d = _wait_state(info, "exited", timeout=90)
    assert d["step"] == 50
    recs = _journal(info)
    phases = [
        (r.t, r.msg.name)
        for r in recs
        if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Phase)
    ]
    assert [n for _, n in phases] == ["checkpoint-save", "train"]
    assert phases[1][0] - phases[0][0] > 10.0  # the save really outlasted the bound
    assert {x.code for x in _raised(info)} & WATCHDOG_CODES == set()
    assert set(_states(info)) <= {"starting", "running", "exited"}


def test_a_healthy_demo_run_of_2000_steps_raises_no_watchdog_finding(trhome: Path) -> None:
    info = start_demo(steps=2000, step_delay=0.0, ckpt_every=1000)
    d = _wait_state(info, "exited", timeout=400)
    assert d["step"] == 2000 and d["exit"]["code"] == 0
    seen = {x.code for x in _raised(info)}
    assert seen & WATCHDOG_CODES == set(), seen
    assert set(_states(info)) <= {"starting", "running", "exited"}
    out = run_cli("status", info.run_id, "--json")
    assert out.returncode == 0 and '"state": "exited"' in out.stdout
