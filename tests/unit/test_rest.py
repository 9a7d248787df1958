"""When a keeper may rest (keeper.rest) and what "live" means (run.live): the pure parts."""

from __future__ import annotations

import pytest

from trainroom.core.ckpt import watch
from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.keeper.pipeline import settling
from trainroom.core.keeper.rest import Quiet, at_rest, linger_over, machine_open, rest_wait, why_awake
from trainroom.core.run.live import runs_trainer
from trainroom.core.run.summary import RunSummary
from trainroom.core.samples import Leftover, ProcsSample
from trainroom.core.wire import protocol as p

IDLE = Quiet(trainer=False, ending=False, acting=False, verifying=False)


@pytest.mark.parametrize("busy", ["trainer", "ending", "acting", "verifying"])
def test_anything_still_running_or_owed_keeps_the_keeper_awake(busy: str) -> None:
    q = Quiet(**{**dict.fromkeys(("trainer", "ending", "acting", "verifying"), False), busy: True})
    assert not q.idle
    assert not at_rest(q, 10.0, p.ProbeSample(t=11.0))


def test_it_rests_only_after_a_probe_taken_after_the_end() -> None:
    assert IDLE.idle
    assert not at_rest(IDLE, 10.0, None)
    assert not at_rest(IDLE, 10.0, p.ProbeSample(t=9.9))
    assert at_rest(IDLE, 10.0, p.ProbeSample(t=10.5, procs=ProcsSample()))
    assert at_rest(IDLE, None, None)  # no attempt ever ran


def test_a_finding_about_the_machine_keeps_the_probes_going_until_it_clears() -> None:
    assert machine_open(["ORPHAN_CONTEXT"]) and machine_open(["NONFINITE", "DISK_HIGH"])
    assert not machine_open(["NONFINITE", "CKPT_REJECTED", "DEAD"])
    assert not machine_open(["DRVFS_CHECKPOINTS"])  # a mount that never changes by itself
    assert not at_rest(IDLE, 10.0, p.ProbeSample(t=11.0), machine=True)
    assert at_rest(IDLE, 10.0, p.ProbeSample(t=11.0), machine=False)


def test_a_process_of_the_run_left_behind_is_watched_on() -> None:
    left = ProcsSample(leftovers=[Leftover(pid=42, attempt=1, cmdline=["python"])])
    assert not at_rest(IDLE, 10.0, p.ProbeSample(t=11.0, procs=left))


def test_it_rests_only_after_a_probe_that_read_the_last_checkpoint_verdict() -> None:
    # A verdict at 12 s after an end at 10 s: the probe at 11 s predates it (the latest checkpoint
    # and the disk it read are stale), the one at 12.5 s does not.
    assert not at_rest(IDLE, 10.0, p.ProbeSample(t=11.0, procs=ProcsSample()), settled_at=12.0)
    assert at_rest(IDLE, 10.0, p.ProbeSample(t=12.5, procs=ProcsSample()), settled_at=12.0)
    assert at_rest(IDLE, 10.0, p.ProbeSample(t=12.5, procs=ProcsSample()), settled_at=3.0)


def test_a_resting_keeper_looks_again_each_rest_probe_or_when_its_linger_ends() -> None:
    # A viewer attached: the rest cadence, however long past the linger.
    assert rest_wait(5.0, 60.0, 0.0, 1000.0, viewers=True, others=True) == 5.0
    # The linger ends in 30 s: the next look is a rest probe away.
    assert rest_wait(5.0, 60.0, 100.0, 130.0, viewers=False, others=False) == 5.0
    # The linger ends in 2 s: the look is then, not a rest probe away.
    assert rest_wait(5.0, 60.0, 100.0, 158.0, viewers=False, others=False) == pytest.approx(2.01)
    assert rest_wait(5.0, 60.0, 0.0, 130.0, viewers=False, others=False) == pytest.approx(0.01)
    # Past the linger with a `status` still being answered: it looks again at the rest cadence
    # (the client's close wakes it sooner).
    assert rest_wait(5.0, 60.0, 0.0, 130.0, viewers=False, others=True) == 5.0


def test_a_watched_checkpoint_still_settling_is_in_flight() -> None:
    q = Quiet(trainer=False, ending=False, acting=False, verifying=True)
    assert not q.idle and not at_rest(q, 10.0, p.ProbeSample(t=11.0))


def test_only_the_linger_without_a_client_being_answered_ends_the_keeper() -> None:
    assert not linger_over(60.0, None, 1000.0, others=False)
    assert not linger_over(60.0, 950.0, 1000.0, others=False)
    assert linger_over(60.0, 900.0, 1000.0, others=False)
    assert not linger_over(60.0, 900.0, 1000.0, others=True)


def _summary(**kw: object) -> RunSummary:
    return RunSummary(run_id="r", created=0.0, status="running", **kw)  # type: ignore[arg-type]


def test_live_means_a_trainer_runs() -> None:
    assert not runs_trainer(False, None, False, False)  # no keeper: never live
    assert runs_trainer(True, None, False, False)  # a keeper without a summary yet
    ended = _summary(attempt=1, attempt_ended=True)
    assert not runs_trainer(True, ended, True, False)
    # An ended summary the journal has outgrown may predate a new attempt: still counted.
    assert runs_trainer(True, ended, False, False)
    running = _summary(attempt=1, attempt_ended=False, pid=1234)
    assert runs_trainer(True, running, False, True)
    assert not runs_trainer(True, running, False, False)  # its pid is gone: it ended since


def test_a_watched_checkpoint_owes_a_verdict_from_its_first_sighting_to_its_verdict() -> None:
    seen = [watch.Sighting(path="/o/ckpt.pt", size=100, mtime_ns=1, ino=7)]
    state, _requests, _recs = watch.poll(watch.WatchState(), seen, 10.0)
    assert settling(state)  # sighted, still settling
    state, requests, _recs = watch.poll(state, seen, 10.0 + watch.SETTLE_S)
    assert requests and settling(state)  # asked to be verified
    state, _recs, stood = watch.record_verdict(state, requests[0], _report(), seen[0], 13.0)
    assert stood and not settling(state)  # judged: nothing owed
    empty = [watch.Sighting(path="/o/empty.pt", size=0, mtime_ns=1, ino=8)]
    assert not settling(watch.poll(watch.WatchState(), empty, 10.0)[0])  # never verified, owes nothing


def _report() -> VerifyReport:
    return VerifyReport(path="/o/ckpt.pt", ok=True)


def test_why_the_keeper_stays_awake_is_said_in_words() -> None:
    ended, probe = 10.0, p.ProbeSample(t=11.0, procs=ProcsSample())
    assert why_awake(IDLE, ended, probe, [], None) is None  # it rests
    running = Quiet(trainer=True, ending=False, acting=False, verifying=False)
    assert why_awake(running, ended, probe, [], None) == "a trainer runs"
    assert why_awake(IDLE, ended, probe, ["GHOST_MEMORY"], None) == "a finding about the machine is open"
    left = p.ProbeSample(
        t=11.0, procs=ProcsSample(leftovers=[Leftover(pid=42, attempt=1, cmdline=["python"])])
    )
    assert why_awake(IDLE, ended, left, [], None) == "a process of the run is left behind"
