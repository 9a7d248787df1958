"""The time-left trigger's decision (core/slurm/timeleft.py) and the checkpoint time the keeper
measures from its run's state (core/keeper/timeleft.py's SaveClock), with [slurm]'s settings."""

from __future__ import annotations

import math

import pytest

from trainroom.core.configuration import config as cfg
from trainroom.core.configuration.config import ConfigError, decode_config
from trainroom.core.keeper.timeleft import SaveClock
from trainroom.core.run.state import CheckpointView, RankView, RunState
from trainroom.core.slurm import timeleft as tl


def test_below_the_checkpoint_time_plus_the_margin_it_fires_and_says_why_in_words() -> None:
    assert tl.decide(130.0, 40.0, 60.0, 60.0) is None  # 130 s >= 40 s + 60 s
    assert tl.decide(100.0, 40.0, 60.0, 60.0) is None  # exactly at the bound: not yet
    why = tl.decide(99.0, 40.0, 60.0, 60.0)
    assert why == "time left 1m39s < checkpoint time 40 s + margin 1m00s"


def test_the_brief_s_example() -> None:
    assert tl.decide(130.0, 40.0, 60.0, 100.0) == "time left 2m10s < checkpoint time 40 s + margin 1m40s"


def test_without_a_measured_checkpoint_the_default_is_used_and_said() -> None:
    why = tl.decide(100.0, None, 60.0, 60.0)
    assert why is not None and why.startswith("time left 1m40s < checkpoint time 1m00s (the default:")
    assert tl.decide(100.0, math.nan, 30.0, 60.0) is None  # a non-finite measure is no measure: 30 + 60
    assert tl.decide(130.0, None, 60.0, 60.0) is None


def test_no_time_limit_never_fires() -> None:
    assert tl.decide(None, 40.0, 60.0, 60.0) is None
    assert tl.decide(math.inf, 40.0, 60.0, 60.0) is None


def test_the_end_time_from_the_environment() -> None:
    assert tl.left_from_env({"SLURM_JOB_END_TIME": "1000"}, 940.0) == 60.0
    assert tl.left_from_env({"SLURM_JOB_END_TIME": "1000"}, 1100.0) == 0.0
    for bad in ("", "0", "soon", "-5", "1e3"):
        assert tl.left_from_env({"SLURM_JOB_END_TIME": bad}, 900.0) is None
    assert tl.left_from_env({}, 900.0) is None


def test_slurmctld_s_answer_is_counted_down_between_queries() -> None:
    assert tl.left_counted_down(120.0, 10.0, 40.0) == 90.0
    assert tl.left_counted_down(20.0, 10.0, 40.0) == 0.0
    assert tl.left_counted_down(120.0, 10.0, 5.0) == 120.0  # a clock that went back counts nothing
    assert tl.left_counted_down(None, 10.0, 40.0) is None  # UNLIMITED


def test_one_checkpoint_s_time_is_its_save_and_its_verification() -> None:
    assert tl.save_seconds(100.0, 140.0, 3.0, 0.5) == 40.0
    # the save came and went between two looks: its verification and one look's interval
    assert tl.save_seconds(None, 140.0, 3.0, 0.5) == 3.5
    assert tl.save_seconds(150.0, 140.0, 3.0, 0.5) == 3.5


def test_the_run_s_checkpoint_time_is_the_longest_of_its_last_three() -> None:
    assert tl.checkpoint_time_s([]) is None
    assert tl.checkpoint_time_s([90.0, 10.0, 20.0, 15.0]) == 20.0
    assert tl.checkpoint_time_s([10.0, math.nan]) == 10.0


def _state() -> RunState:
    return RunState(run_id="r", argv=["python", "t.py"], cwd="/", created=0.0)


def test_the_keeper_measures_from_the_save_phase_to_the_verdict() -> None:
    st, clock = _state(), SaveClock(poll_s=0.5)
    st.checkpoints = [CheckpointView(path="/c/old.pt", step=1, state="verified", t=50.0)]
    clock.observe(st)  # verified before the keeper looked: no save start seen, not measured
    assert clock.seconds() is None
    st.ranks = {0: RankView(rank=0, attempt=1, phase="checkpoint-save", phase_since=100.0)}
    clock.observe(st)
    st.ranks[0].phase, st.ranks[0].phase_since = "train", 112.0
    st.checkpoints.append(CheckpointView(path="/c/a.pt", step=5, state="candidate", t=112.0))
    clock.observe(st)
    assert clock.seconds() is None  # not verified yet
    st.checkpoints[1].state, st.checkpoints[1].t = "verified", 118.0
    clock.observe(st)
    clock.observe(st)  # each checkpoint is measured once
    assert clock.measured == [18.0] and clock.seconds() == 18.0
    # a save too short to be seen: its verification and a look's interval
    st.checkpoints.append(CheckpointView(path="/c/b.pt", step=9, state="verified", t=200.0))
    clock.observe(st)
    assert clock.measured == [18.0, 0.5] and clock.seconds() == 18.0


def test_the_settings_have_defaults_and_refuse_nonsense() -> None:
    s = cfg.Config().slurm
    assert (s.margin_s, s.checkpoint_time_s, s.time_left_every_s, s.time_left_trigger) == (60, 60, 10, True)
    got = decode_config("[slurm]\nmargin_s = 30\ncheckpoint_time_s = 5\n").slurm
    assert (got.margin_s, got.checkpoint_time_s) == (30, 5)
    for bad in ("margin_s = -1", "margin_s = nan", "time_left_every_s = 0.1", "margn_s = 3"):
        with pytest.raises(ConfigError):
            decode_config(f"[slurm]\n{bad}\n")
