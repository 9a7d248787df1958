"""The watchdog's rules on RunStates built from protocol records with a fake clock.

Real-process checks of the probes that feed it live in test_probes_*.py; here the probe results
are given as the dicts those probes return.
"""

from __future__ import annotations

import errno
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import msgspec
import pytest

from tests.support.run_builder import RunBuilder
from trainroom.core.configuration.config import Thresholds
from trainroom.core.health.crash import masked_error
from trainroom.core.health.host import host_ram_low
from trainroom.core.health.watchdog import (
    Verdict,
    WatchContext,
    Watchdog,
    context_from_probe,
    crash_from_log,
    median_interval,
)
from trainroom.core.samples import (
    Duplicate,
    GpuDevice,
    GpuProcess,
    GpuSample,
    HostSample,
    LockHolder,
    LockInfo,
    ProcsSample,
)
from trainroom.core.wire import protocol as p

GIB = 1 << 30


def codes(verdict) -> set[str]:
    return {f.code for f in verdict.findings}


def finding(verdict, code):
    found = [f for f in verdict.findings if f.code == code]
    assert found, f"no {code} in {[f.code for f in verdict.findings]}"
    return found[0]


# --------------------------------------------------------------------------- no false finding


def test_healthy_run_with_a_long_checkpoint_save_raises_nothing() -> None:
    b = RunBuilder()
    wd = Watchdog()
    ctx = WatchContext(alive=True, attempt_pids=[4242], proc_states={4242: "S"}, activity={4242: 1})
    rng = random.Random(7)
    b.start()
    seen_states: set[str] = set()
    all_codes: set[str] = set()
    statuses: set[tuple[str, str]] = set()  # each distinct one is a RunStatus the keeper journals

    def tick_until(t_end: float, phase: str = "train", phase_start: float | None = None) -> None:
        # Evaluate every 0.25 s, heartbeating each second, as the keeper would see it.
        next_beat = b.now + 1.0
        while b.now < t_end:
            b.now = min(t_end, b.now + 0.25)
            if b.now >= next_beat:
                age = (b.now - phase_start) if phase_start is not None else 0.2
                b.beat(phase=phase, main_frame_age=age)
                next_beat += 1.0
            v = wd.evaluate(b.run, ctx, b.now)
            seen_states.add(v.state)
            all_codes.update(codes(v))
            statuses.add((v.state, v.reason))

    tick_until(b.now + 5.0)  # imports and set-up before the first step
    for block in range(2):
        for _ in range(600):  # steps every ~0.1 s with jitter, evaluated between them
            dt = 0.1 + rng.uniform(-0.03, 0.03)
            b.now += dt
            b.do_step(reserved=4 * GIB)
            if b.step % 10 == 0:
                b.beat(main_frame_age=0.05)
            if b.step % 3 == 0:
                v = wd.evaluate(b.run, ctx, b.now)
                seen_states.add(v.state)
                all_codes.update(codes(v))
                statuses.add((v.state, v.reason))
        if block == 0:
            # A 30 s checkpoint save in the middle: the main thread sits in torch.save all along.
            start = b.now
            b.rx(p.Phase(name="checkpoint-save", t=b.now))
            tick_until(b.now + 30.0, phase="checkpoint-save", phase_start=start)
            b.rx(p.Phase(name="train", t=b.now))
            b.beat(main_frame_age=0.0)
            # Right after the save, before the next step: the save's 30 s are not a step gap.
            v = wd.evaluate(b.run, ctx, b.now + 0.05)
            all_codes.update(codes(v))
    assert all_codes == set()
    assert seen_states <= {"starting", "running"}
    assert "running" in seen_states
    assert statuses == {("starting", "no step yet"), ("running", "steps flowing")}


def test_healthy_gpu_and_host_raise_nothing() -> None:
    b = RunBuilder()
    b.start()
    b.steps(30, reserved=4 * GIB)
    wd = Watchdog()
    host = HostSample(t=1.0, available=True, effective_available_bytes=20 * GIB, page_cache_bytes=GIB)
    for i in range(4):
        gpu = GpuSample(
            t=float(i),
            available=True,
            pid_namespace="host",
            per_process=True,
            devices=[
                GpuDevice(
                    index=0,
                    used_bytes=4 * GIB + (300 << 20),
                    total_bytes=12 * GIB,
                    util_percent=97,
                    power_w=160.0,
                )
            ],
            processes=[
                GpuProcess(
                    pid=4242, used_bytes=4 * GIB + (300 << 20), exists=True, ours=True, device=0, state="R"
                )
            ],
        )
        v = wd.evaluate(b.run, WatchContext(alive=True, gpu=gpu, host=host), b.now + 0.05)
        assert v.findings == [] and v.state == "running"


# --------------------------------------------------------------------------- life


def test_silent_death_is_dead_with_signal_last_step_and_steps_lost() -> None:
    b = RunBuilder()
    b.start()
    b.steps(300)
    b.verified(300)
    b.steps(22)
    b.now += 0.05
    b.end(exit_signal=signal.SIGKILL)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now + 0.01)
    assert v.state == "dead"
    f = finding(v, "DEAD")
    assert f.severity == "critical" and f.action == "resume"
    assert "SIGKILL" in f.message and "322" in f.message and "22 steps lost" in f.message
    assert "no traceback" in f.message
    assert f.evidence["steps_lost"] == 22 and f.evidence["last_verified_step"] == 300
    assert f.evidence["signal"] == "SIGKILL" and f.evidence["last_step"] == 322


def test_dead_before_the_exit_status_is_known_and_without_checkpoint() -> None:
    b = RunBuilder()
    b.start()
    b.steps(10)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now + 0.2)
    assert v.state == "dead"
    f = finding(v, "DEAD")
    assert "exit status not yet known" in f.message and "no verified checkpoint" in f.message
    assert f.evidence["steps_lost"] == 10


def test_exit_code_through_a_shell_names_the_signal() -> None:
    b = RunBuilder()
    b.start()
    b.steps(3)
    b.end(exit_code=137)
    f = finding(Watchdog().evaluate(b.run, WatchContext(), b.now), "DEAD")
    assert "exit code 137 (128+SIGKILL" in f.message


def test_clean_exit_is_exited_without_findings() -> None:
    b = RunBuilder()
    b.start()
    b.steps(5)
    b.rx(p.Bye(t=b.now))
    b.end(exit_code=0)
    v = Watchdog().evaluate(b.run, WatchContext(alive=False), b.now)
    assert v.state == "exited" and v.findings == []


def test_after_bye_a_slow_exit_is_neither_stalled_nor_hung() -> None:
    b = RunBuilder()
    b.start()
    b.steps(20)
    b.rx(p.Bye(t=b.now))
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now + 60)
    assert v.state == "running" and v.findings == []


def test_repeat_death_near_the_same_step_and_its_clearing() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(322)
    b.end(exit_signal=signal.SIGKILL)
    b.start(pid=4343, first_step=300)
    b.steps(25)  # dies at 325
    b.end(exit_signal=signal.SIGKILL)
    v = wd.evaluate(b.run, WatchContext(), b.now)
    f = finding(v, "REPEAT_DEATH")
    assert f.evidence["steps"] == [322, 325] and "near step 325" in f.message
    # A third attempt that gets well past the region clears it.
    b.start(pid=4444, first_step=300)
    b.steps(30)
    assert "REPEAT_DEATH" in codes(wd.evaluate(b.run, WatchContext(alive=True), b.now))
    b.steps(60)
    assert "REPEAT_DEATH" not in codes(wd.evaluate(b.run, WatchContext(alive=True), b.now))


def test_deaths_far_apart_are_not_repeat_deaths() -> None:
    b = RunBuilder()
    b.start()
    b.steps(100)
    b.end(exit_signal=signal.SIGKILL)
    b.start(pid=4343, first_step=100)
    b.steps(300)
    b.end(exit_code=1)
    assert "REPEAT_DEATH" not in codes(Watchdog().evaluate(b.run, WatchContext(), b.now))


# --------------------------------------------------------------------------- progress


def test_stall_is_stalled_only_past_the_bound() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)  # median 0.1 s: the bound is the 10 s floor
    last = b.now
    ctx = WatchContext(alive=True, proc_states={4242: "R"})
    for k in range(1, 10):
        b.now = last + k
        b.beat()
        assert wd.evaluate(b.run, ctx, b.now).state == "running"
    b.now = last + 9.9
    assert wd.evaluate(b.run, ctx, b.now).state == "running"
    b.now = last + 10.2
    b.beat()
    v = wd.evaluate(b.run, ctx, b.now)
    assert v.state == "stalled"
    f = finding(v, "STALLED")
    assert "alive, heartbeats flowing, no step for 10 s" in f.message  # core/units: 10.2 s is "10 s"
    assert f.evidence["last_step"] == 50 and f.action == "dump"
    # While it lasts, the message (and the status reason) keep still: the keeper journals
    # changes, not ticks. The evidence carries the live figure.
    b.now = last + 25.0
    b.beat()
    later = wd.evaluate(b.run, ctx, b.now)
    assert later.reason == v.reason and finding(later, "STALLED").message == f.message
    assert finding(later, "STALLED").evidence["gap_s"] == 25.0
    # A new cause is a new message.
    hung = wd.evaluate(b.run, WatchContext(alive=True, proc_states={4242: "T"}), b.now)
    assert hung.state == "hung" and "state T" in finding(hung, "HUNG").message


def test_stall_bound_follows_the_median_step_interval() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(20, interval=5.0)  # median 5 s: bound 15 s
    last = b.now
    b.now = last + 12
    b.beat()
    assert wd.evaluate(b.run, WatchContext(alive=True), b.now).state == "running"
    b.now = last + 15.5
    b.beat()
    v = wd.evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "stalled" and finding(v, "STALLED").evidence["bound_s"] == pytest.approx(15.0, rel=0.01)


def test_a_busy_main_thread_on_one_line_is_a_stall_not_a_hang() -> None:
    # Scenario 2's loop: it keeps computing micro-batches and never steps; the heartbeat's frame
    # sampler may see the same line for a long time, but the thread keeps running.
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    last = b.now
    for k in range(1, 13):
        b.now = last + k
        b.beat(main_frame_age=float(k))
        v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 100 + k}), b.now)
    assert v.state == "stalled" and "HUNG" not in codes(v)


def test_a_parked_main_thread_is_hung() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    last = b.now
    for k in range(1, 13):
        b.now = last + k
        b.beat(main_frame_age=float(k))
        v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 7}), b.now)
    assert v.state == "hung"
    f = finding(v, "HUNG")
    assert "main thread has sat on train.py:10 in main" in f.message and f.action == "dump"


def _park(
    wd: Watchdog,
    b: RunBuilder,
    activity: Callable[[float], dict[int, int]],
    probe_t: Callable[[float], float],
    until: float,
) -> list[tuple[float, Verdict]]:
    """Heartbeats each second on one line since the last step (the sampler first sees the new
    frame at the first beat after it), evaluated every 0.25 s as the keeper does."""
    last = b.now
    verdicts = []
    for i in range(1, int(until * 4) + 1):
        k = i / 4
        b.now = last + k
        if i % 4 == 0:
            b.beat(main_frame_age=k - 1.0)
        ctx = WatchContext(alive=True, activity=activity(k), probe_t=probe_t(k))
        verdicts.append((k, wd.evaluate(b.run, ctx, b.now)))
    return verdicts


def test_a_main_thread_parked_since_its_last_step_is_hung_at_the_step_bound_without_a_stall_first() -> None:
    # hang-lock: the lock is taken right after a step; the frame's own age reaches the bound a
    # heartbeat after the step gap does, and STALLED must not be raised in between.
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 6}, probe_t=b.now), b.now)
    verdicts = _park(
        wd, b, activity=lambda k: {4242: 6 if k < 0.5 else 7}, probe_t=lambda k: b.now - k % 1.0, until=11.0
    )
    assert all("STALLED" not in codes(v) for _, v in verdicts)
    assert all(v.state == "running" for k, v in verdicts if k < 10.0)
    k, v = next((k, v) for k, v in verdicts if v.state != "running")
    assert v.state == "hung" and k <= 10.25  # the 10 s step bound, give or take a tick
    f = finding(v, "HUNG")
    assert f.evidence["cause"] == "main-frame" and "since step 50" in f.message


def test_a_busy_loop_on_one_line_with_a_stale_activity_probe_is_not_called_parked() -> None:
    # The probe stopped reading (a wedged cycle) while the loop ran: a counter that stands still
    # because nobody read it says nothing.
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    t_last = b.now
    verdicts = _park(
        wd,
        b,
        activity=lambda k: {4242: 100 + int(min(k, 1.0) * 4)},
        probe_t=lambda k: t_last + 1.0,
        until=10.5,
    )
    assert verdicts[-1][1].state == "stalled"
    assert all(v.state != "hung" for _, v in verdicts)


def test_the_tick_after_a_long_phase_ends_is_not_a_hang() -> None:
    # Seen end to end: the save's last heartbeat still says the main thread sat 12 s on one line,
    # the phase has just ended, and the next step or heartbeat has not come yet.
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(30, interval=0.02)
    b.rx(p.Phase(name="checkpoint-save", t=b.now))
    start = b.now
    for k in range(1, 13):
        b.now = start + k + 0.4
        b.beat(phase="checkpoint-save", main_frame_age=float(k))
        v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 7}), b.now)
        assert v.findings == [] and v.state == "running", k
    b.now = start + 13.0
    b.rx(p.Phase(name="train", t=b.now))
    for dt in (0.01, 0.1, 0.3):
        v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 7}), b.now + dt)
        assert v.findings == [] and v.state == "running", dt


def test_no_heartbeat_is_hung() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    b.now += 9.5
    assert wd.evaluate(b.run, WatchContext(alive=True), b.now).state == "running"
    b.now += 1.0
    v = wd.evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "hung"
    f = finding(v, "HUNG")
    assert f.severity == "critical" and "no heartbeat (nor step) for 10 s (bound 10 s)" in f.message


def test_sigstopped_process_is_hung_at_once() -> None:
    b = RunBuilder()
    b.start()
    b.steps(50)
    v = Watchdog().evaluate(b.run, WatchContext(alive=True, proc_states={4242: "T"}), b.now + 0.3)
    assert v.state == "hung"
    f = finding(v, "HUNG")
    # The fix that fits a stop: continue it (a dump only shows where it stopped).
    assert "state T" in f.message and f.action == "continue"


def test_d_state_is_hung_only_when_it_persists() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(50)
    t0 = b.now
    for k in range(12):
        b.now = t0 + k
        b.beat()
        # A flicker of D (ordinary I/O) resets the clock.
        st = "S" if k == 3 else "D"
        v = wd.evaluate(b.run, WatchContext(alive=True, proc_states={4242: st}), b.now)
        assert v.state != "hung", k
    # By now the steps have stopped too; D since t0+4 passes the 10 s bound at t0+14.1.
    b.now = t0 + 14.5
    b.beat()
    v = wd.evaluate(b.run, WatchContext(alive=True, proc_states={4242: "D"}), b.now)
    assert v.state == "hung" and "state D" in finding(v, "HUNG").message


def test_slow_when_the_last_k_intervals_exceed_three_medians() -> None:
    b = RunBuilder()
    b.start()
    b.steps(40, interval=0.1)
    b.steps(4, interval=0.5)
    assert Watchdog().evaluate(b.run, WatchContext(alive=True), b.now).state == "running"
    b.steps(1, interval=0.5)
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "slow"
    f = finding(v, "SLOW")
    assert f.evidence["median_s"] == pytest.approx(0.1, abs=0.01) and f.action == "bench"


def test_starting_then_no_first_step_is_stalled() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    for k in range(1, 121):
        b.now += 1.0
        b.beat(main_frame_age=float(k))  # compile or data loading: one long call
        v = wd.evaluate(b.run, WatchContext(alive=True), b.now)
        assert v.state == "starting" and v.findings == [], k
    b.now += 1.0
    b.beat()
    v = wd.evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "stalled" and "no first step" in finding(v, "STALLED").message


def test_resume_uses_the_previous_attempts_cadence() -> None:
    b = RunBuilder()
    b.start()
    b.steps(100, interval=0.1)
    b.end(exit_signal=signal.SIGKILL)
    b.start(pid=5555, first_step=100)
    b.steps(1)  # scenario 2's resume: one step, then the counter never fires again
    assert median_interval(b.run, Thresholds()) == pytest.approx(0.1, abs=0.01)
    last = b.now
    b.now = last + 10.5
    b.beat()
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "stalled"


def test_a_phase_past_its_own_bound_is_a_stall() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start()
    b.steps(30)
    b.rx(p.Phase(name="eval", t=b.now, bound_s=60.0))
    start = b.now
    for k in range(1, 61):
        b.now = start + k
        b.beat(phase="eval", main_frame_age=float(k))
        v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: k}), b.now)
        assert v.state == "running", k
    b.now = start + 61
    b.beat(phase="eval", main_frame_age=61.0)
    v = wd.evaluate(b.run, WatchContext(alive=True, activity={4242: 99}), b.now)
    assert v.state == "stalled"
    assert "eval phase for 1m01s, over its bound 1m00s" in finding(v, "STALLED").message


def test_uninstrumented_stall_and_hang_from_log_steps() -> None:
    b = RunBuilder()
    wd = Watchdog()
    b.start(instrumented=False)
    for _ in range(30):
        b.now += 0.5
        b.do_step(source="log")
    last = b.now
    running = WatchContext(alive=True, proc_states={4242: "R"})
    b.now = last + 9
    assert wd.evaluate(b.run, running, b.now).state == "running"
    b.now = last + 16
    v = wd.evaluate(b.run, running, b.now)
    assert v.state == "stalled" and "process running (uninstrumented)" in finding(v, "STALLED").message
    # The same silence with a main thread that has not run at all: blocked, a hang.
    wd2 = Watchdog()
    wd2.evaluate(b.run, WatchContext(alive=True, activity={4242: 5}), last)
    v = wd2.evaluate(b.run, WatchContext(alive=True, activity={4242: 5}), b.now)
    assert v.state == "hung"


def test_uninstrumented_without_step_telemetry_watches_life_only() -> None:
    b = RunBuilder()
    b.start(instrumented=False)
    wd = Watchdog()
    assert wd.evaluate(b.run, WatchContext(alive=True), b.now + 5).state == "starting"
    v = wd.evaluate(b.run, WatchContext(alive=True), b.now + 3600)
    assert v.state == "running" and v.findings == []


def test_only_ranks_that_step_bound_progress_and_every_rank_must_beat() -> None:
    b = RunBuilder()
    b.start()
    b.rx(p.Hello(pid=4243, rank=1, world_size=2), rank=1)
    for _ in range(40):
        b.now += 0.1
        b.do_step()  # rank 0 only reports steps
        b.beat(rank=1)
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now + 0.5)
    assert v.state == "running"
    b.now += 11
    b.beat(rank=0)
    b.do_step()
    v = Watchdog().evaluate(b.run, WatchContext(alive=True), b.now)
    assert v.state == "hung" and finding(v, "HUNG").evidence["rank"] == 1


# --------------------------------------------------------------------------- crash cause


def _real_traceback(code: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1
    return res.stderr


def test_masked_enomem_from_a_real_traceback_in_the_log() -> None:
    log = "iter 10: loss 2.3\n" + _real_traceback("""
        import errno
        def load():
            try:
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            except OSError as exc:
                raise SystemError("readinto") from exc
        load()
    """)
    crash = crash_from_log(log, t=5.0)
    assert crash is not None and crash.source == "log"
    assert [(x.type, x.message) for x in crash.chain] == [
        ("SystemError", "readinto"),
        ("OSError", "[Errno 12] Cannot allocate memory"),
    ]
    assert crash.chain[-1].errno == errno.ENOMEM and crash.chain[-1].errno_name == "ENOMEM"
    b = RunBuilder()
    b.start(instrumented=False)
    b.steps(10)
    b.end(exit_code=1)
    v = Watchdog().evaluate(b.run, WatchContext(log_crash=crash), b.now)
    f = finding(v, "MASKED_ERROR")
    assert "`SystemError: readinto` hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f.message
    assert f.action == "reclaim"
    assert "OSError: [Errno 12]" in finding(v, "DEAD").message


def test_masked_error_from_the_reporters_crash() -> None:
    b = RunBuilder()
    b.start()
    b.steps(10)
    b.rx(
        p.Crash(
            t=b.now,
            chain=[
                p.ErrorLink(type="SystemError", message="readinto"),
                p.ErrorLink(type="OSError", message="[Errno 12] Cannot allocate memory", errno=12),
            ],
        )
    )
    b.end(exit_code=1)
    f = finding(Watchdog().evaluate(b.run, WatchContext(), b.now), "MASKED_ERROR")
    assert f.evidence["errno_name"] == "ENOMEM" and f.key == "attempt-1"


def test_masked_error_is_critical_once_it_ended_the_attempt() -> None:
    # One rule for the watchdog and the verifier: critical when it killed the attempt (or blocks a
    # resume), a warning while the attempt that reported it still runs.
    b = RunBuilder()
    b.start()
    b.steps(10)
    chain = [
        p.ErrorLink(type="SystemError", message="readinto"),
        p.ErrorLink(type="OSError", message="[Errno 12] Cannot allocate memory", errno=12),
    ]
    b.rx(p.Crash(t=b.now, chain=chain))
    live = finding(Watchdog().evaluate(b.run, WatchContext(alive=True), b.now), "MASKED_ERROR")
    assert live.severity == "warning" and live.evidence["source"] == "reporter"
    b.end(exit_code=1)
    dead = finding(Watchdog().evaluate(b.run, WatchContext(), b.now), "MASKED_ERROR")
    assert dead.severity == "critical" and dead.message == live.message
    # The verifier's use: a load that fails with it blocks the resume, keyed by the checkpoint.
    load = masked_error(chain, during="torch.load step-000300.pt", key="/ck/step-000300.pt")
    assert load is not None and load.severity == "critical" and load.key == "/ck/step-000300.pt"
    assert load.message == f"torch.load step-000300.pt: {dead.message}"
    # A re-raise of the same kind (type and errno) with more words is not a mask.
    same = [p.ErrorLink(type="RuntimeError", message="a"), p.ErrorLink(type="RuntimeError", message="b")]
    assert masked_error(same) is None


def test_host_ram_low_is_one_rule_for_the_watchdog_and_a_load() -> None:
    host = HostSample(t=1.0, available=True, effective_available_bytes=2 * GIB, page_cache_bytes=6 * GIB)
    b = RunBuilder()
    b.start()
    now = finding(Watchdog().evaluate(b.run, WatchContext(alive=True, host=host), b.now), "HOST_RAM_LOW")
    assert now.severity == "warning" and now.key == "" and now.evidence["threshold_bytes"] == 3 * GIB
    # Before a load of 4 GiB: the resume is blocked, so critical, and keyed by what is loaded.
    load = host_ram_low(2 * GIB, 4 * GIB, "step-000300.pt", floor_bytes=3 * GIB, host=host)
    assert load is not None and load.severity == "critical" and load.key == "step-000300.pt"
    assert "2.0 GiB available, loading step-000300.pt needs 4.0 GiB" in load.message
    assert host_ram_low(5 * GIB, 4 * GIB, "x", floor_bytes=3 * GIB) is None
    # The attempt died of ENOMEM: the same low RAM is critical.
    b.rx(p.Crash(t=b.now, chain=[p.ErrorLink(type="OSError", message="[Errno 12] oom", errno=12)]))
    v = Watchdog().evaluate(b.run, WatchContext(alive=True, host=host), b.now)
    assert finding(v, "HOST_RAM_LOW").severity == "critical"


def test_a_single_error_is_not_masked() -> None:
    b = RunBuilder()
    b.start()
    b.rx(p.Crash(t=b.now, chain=[p.ErrorLink(type="ValueError", message="bad")]))
    b.end(exit_code=1)
    assert "MASKED_ERROR" not in codes(Watchdog().evaluate(b.run, WatchContext(), b.now))


def test_crash_from_log_takes_the_last_traceback_and_follows_context_chains() -> None:
    first = _real_traceback("raise KeyError('earlier, unrelated')")
    last = _real_traceback("""
        try:
            open('/nonexistent/dir/file')
        except OSError:
            raise RuntimeError("could not read the shard")
    """)
    ranked = "".join(f"[rank0]: {line}\n" for line in last.splitlines())
    for log in (first + "iter 5: loss 1.0\n" + last, first + ranked):
        crash = crash_from_log(log)
        assert crash is not None
        assert [x.type for x in crash.chain] == ["RuntimeError", "FileNotFoundError"]
        assert crash.chain[-1].errno_name == "ENOENT"
    assert crash_from_log("no traceback here\n") is None
    bare = crash_from_log(_real_traceback("raise EOFError()"))
    assert bare is not None and bare.chain[0].type == "EOFError" and bare.chain[0].message == ""


# --------------------------------------------------------------------------- host, locks, duplicates


def test_host_ram_low_gives_the_figures_and_reclaim() -> None:
    b = RunBuilder()
    b.start()
    host = HostSample(
        t=b.now,
        available=True,
        effective_available_bytes=int(2.1 * GIB),
        page_cache_bytes=6 * GIB,
        mem_total_bytes=32 * GIB,
    )
    f = finding(Watchdog().evaluate(b.run, WatchContext(alive=True, host=host), b.now), "HOST_RAM_LOW")
    assert f.action == "reclaim" and "2.1 GiB available (< 3.0 GiB)" in f.message and "6.0 GiB" in f.message
    host = msgspec.structs.replace(host, effective_available_bytes=3 * GIB)
    assert "HOST_RAM_LOW" not in codes(Watchdog().evaluate(b.run, WatchContext(alive=True, host=host), b.now))


def test_stale_lock_rules() -> None:
    b = RunBuilder()
    b.start(pid=500)
    lock = LockInfo(
        path="/p/train.lock",
        key="fe:00:1",
        exists=True,
        held=True,
        holders=[LockHolder(pid=400, exists=False, kind="FLOCK", mode="WRITE")],
        inheritors=[LockHolder(pid=401, exists=True, state="S", pgid=400, comm="python")],
    )
    f = finding(
        Watchdog().evaluate(b.run, WatchContext(alive=True, attempt_pids=[500], locks=[lock]), b.now),
        "STALE_LOCK",
    )
    assert "held by pid 400: pid 400 no longer exists" in f.message and "pid 401" in f.message
    assert f.evidence["kill_pids"] == [401] and f.evidence["kill_pgids"] == [400] and f.action == "kill"
    ours = msgspec.structs.replace(
        lock, holders=[LockHolder(pid=500, exists=True, state="S", kind="FLOCK")], inheritors=[]
    )
    assert "STALE_LOCK" not in codes(
        Watchdog().evaluate(b.run, WatchContext(alive=True, attempt_pids=[500], locks=[ours]), b.now)
    )
    # The same holder once our attempt is dead: it holds what the next attempt needs.
    b.end(exit_signal=9)
    f = finding(Watchdog().evaluate(b.run, WatchContext(alive=False, locks=[ours]), b.now), "STALE_LOCK")
    assert "not the current attempt" in f.message
    # ... but not on a probe cycle read before the death: that holder was the live attempt then.
    before = WatchContext(alive=False, locks=[ours], probe_t=b.now - 0.5)
    assert "STALE_LOCK" not in codes(Watchdog().evaluate(b.run, before, b.now + 0.1))
    after = WatchContext(alive=False, locks=[lock], probe_t=b.now + 0.5)
    assert "no longer exists" in finding(Watchdog().evaluate(b.run, after, b.now + 0.6), "STALE_LOCK").message


def test_duplicate_trainer_names_both_pids() -> None:
    b = RunBuilder()
    b.start(pid=500)
    dup = Duplicate(
        kind="trainer", ours=500, others=[777], pids=[500, 777], cmdline=["python", "train.py"], cwd="/p"
    )
    f = finding(
        Watchdog().evaluate(b.run, WatchContext(alive=True, duplicates=[dup]), b.now), "DUPLICATE_TRAINER"
    )
    assert "pid 777" in f.message and "ours is pid 500" in f.message and f.evidence["pids"] == [500, 777]


# --------------------------------------------------------------------------- wiring


def test_the_watchdog_judges_by_the_configs_thresholds() -> None:
    from trainroom.core.configuration.config import decode_config
    from trainroom.core.configuration.sections import ConfigError

    th = decode_config(
        "[thresholds]\nstall_floor_s = 20.0\nslow_steps = 7\nhost_ram_low_gib = 4.0\npark_slack_s = 1.5\n"
    ).thresholds
    assert th.stall_floor_s == 20.0 and th.slow_steps == 7 and th.host_ram_low_bytes == 4 * GIB
    assert th.park_slack_s == 1.5 and th.orphan_cycles == 2  # the watchdog's own knobs live there too
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"stall_floor": 3}, Thresholds)
    with pytest.raises(ConfigError, match=r"thresholds\.orphan_cycles"):
        decode_config("[thresholds]\norphan_cycles = 0\n")
    # A configured floor moves the bound the STALLED finding judges by.
    b = RunBuilder()
    b.start()
    b.steps(50)
    last = b.now
    b.now = last + 15.0
    b.beat()
    ctx = WatchContext(alive=True, thresholds=th)
    assert Watchdog().evaluate(b.run, ctx, b.now).state == "running"
    b.now = last + 20.5
    b.beat()
    v = Watchdog().evaluate(b.run, ctx, b.now)
    assert v.state == "stalled" and finding(v, "STALLED").evidence["bound_s"] == 20.0


def test_context_from_a_probe_sample_after_a_json_round_trip() -> None:
    sample = p.ProbeSample(
        t=1.0,
        gpu=GpuSample(t=1.0, available=False),
        host=HostSample(t=1.0, available=True),
        procs=ProcsSample(states={4242: "T"}, activity={4242: 3}),
    )
    back = msgspec.json.decode(msgspec.json.encode(sample), type=p.ProbeSample)
    ctx = context_from_probe(back, alive=True)
    assert ctx.proc_states == {4242: "T"} and ctx.activity == {4242: 3} and ctx.attempt_pids == [4242]
    b = RunBuilder()
    b.start()
    b.steps(3)
    assert Watchdog().evaluate(b.run, ctx, b.now).state == "hung"
    # States sampled for attempt 1 say nothing about attempt 2.
    sample.procs = ProcsSample(attempt=1, states={4242: "T"}, activity={4242: 3})
    assert context_from_probe(sample, alive=True, attempt=2).proc_states == {}
    assert context_from_probe(sample, alive=True, attempt=1).proc_states == {4242: "T"}


def test_core_watchdog_and_probes_import_without_torch_or_textual() -> None:
    code = (
        "import sys, trainroom.core.health.watchdog, trainroom.core.probes.sweep, trainroom.core.probes.fake_nvml; "
        "bad = [m for m in ('torch', 'textual', 'rich') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
