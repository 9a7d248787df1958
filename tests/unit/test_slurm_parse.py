"""core/slurm: a task's place from srun's environment, and scontrol's one-line form read
defensively (22.05's real output, a node with a spaced reason, values that do not parse)."""

from __future__ import annotations

from trainroom.core.slurm.place import in_step, place_of, rank_env
from trainroom.core.slurm.scontrol import JobInfo, NodeInfo, SlurmError, SlurmReader, duration_s, hostnames

# `scontrol show job -o 1` from Slurm 22.05.8 (tests/support/slurm_cluster.py's cluster).
JOB = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:41 TimeLimit=00:01:00 TimeMin=N/A "
    "NodeList=n[1-2] BatchHost=n1 NumNodes=2 Command=/tmp/a dir/job.sh WorkDir=/tmp/a dir StdOut=/dev/null"
)


def test_place_of_a_task_names_the_job_node_rank_and_attempt() -> None:
    env = {
        "SLURM_JOB_ID": "17",
        "SLURM_STEP_ID": "0",
        "SLURMD_NODENAME": "n2",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_RESTART_COUNT": "1",
    }
    pl = place_of(env)
    assert pl is not None and pl.job_name == "slurm-17" and pl.node == "n2"
    assert (pl.procid, pl.ntasks, pl.restart_count) == (1, 2, 1)
    assert in_step(env) and not in_step({"SLURM_JOB_ID": "17"})  # the batch script is no step
    assert rank_env(pl, env, ["python", "t.py"]) == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert rank_env(pl, env, ["torchrun", "--nproc-per-node=8", "t.py"]) == {}
    assert rank_env(pl, dict(env, RANK="5"), ["python", "t.py"]).get("RANK") is None
    arr = place_of(dict(env, SLURM_ARRAY_JOB_ID="16", SLURM_ARRAY_TASK_ID="3"))
    assert arr is not None and arr.job_name == "slurm-16_3"
    assert place_of({"SLURM_JOB_ID": "x; rm -rf"}) is None
    assert place_of({"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "bad name$"}) is None


def test_job_line_with_spaces_in_values_and_times_parses() -> None:
    j = JobInfo.parse(JOB)
    assert j is not None
    assert (j.state, j.reason, j.nodes, j.restarts) == ("COMPLETING", None, ["n1", "n2"], 0)
    assert (j.time_limit_s, j.run_time_s, j.time_left_s) == (60.0, 41.0, 19.0)
    assert j.command == "/tmp/a dir/job.sh" and j.work_dir == "/tmp/a dir"
    assert JobInfo.parse("garbage without a job id") is None
    assert JobInfo.parse("JobId=3 TimeLimit=soon RunTime=-1") is not None


def test_durations_and_hostlists() -> None:
    assert duration_s("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert (
        duration_s("05:06") == 306 and duration_s("7") == 420 and duration_s("2-03") == 2 * 86400 + 3 * 3600
    )
    assert duration_s("UNLIMITED") is None and duration_s("1:x") is None
    assert hostnames("gpu[01-03,7],login") == ["gpu01", "gpu02", "gpu03", "gpu7", "login"]
    assert hostnames("n[1-2]") == ["n1", "n2"] and hostnames("(null)") == []
    assert hostnames("n[a-b]") == ["n[a-b]"]


def test_node_states_read_down_and_drained_with_their_reason() -> None:
    n = NodeInfo.parse(
        "NodeName=n2 Arch=x86_64 State=DOWN* Reason=Not responding [slurm@2026-12-06T06:00:00]"
    )
    assert n is not None and n.down and n.reason == "Not responding [slurm@2026-12-06T06:00:00]"
    ok = NodeInfo.parse("NodeName=n1 State=ALLOCATED Reason=")
    assert ok is not None and not ok.down
    assert (
        NodeInfo.parse("NodeName=n3 State=IDLE+DRAIN") is not None
        and NodeInfo.parse("NodeName=n3 State=IDLE+DRAIN").down
    )  # type: ignore[union-attr]


def test_reader_asks_slurmctld_at_most_once_per_interval() -> None:
    now = [0.0]
    asked: list[tuple[str, ...]] = []

    def runner(argv: object) -> tuple[int, str, str]:
        asked.append(tuple(argv))  # type: ignore[arg-type]
        return 0, JOB + "\n", ""

    r = SlurmReader(runner=runner, min_interval_s=3.0, clock=lambda: now[0])
    for _ in range(50):
        assert r.job("1") is not None
    now[0] = 2.9
    r.job("1")
    assert r.calls == 1
    now[0] = 3.1
    r.job("1")
    assert r.calls == 2 and len(asked) == 2


def test_reader_failures_are_one_line_errors_and_an_unknown_job_is_none() -> None:
    r = SlurmReader(runner=lambda argv: (1, "", "slurm_load_jobs error: Invalid job id specified"))
    assert r.job("9") is None
    r2 = SlurmReader(runner=lambda argv: (1, "", "slurm_load_jobs error: Unable to contact slurm controller"))
    try:
        r2.job("9")
    except SlurmError as exc:
        assert "Unable to contact" in str(exc)
    else:
        raise AssertionError("no error")


def test_slurm_view_says_the_job_s_end_and_its_nodes_in_words() -> None:
    from trainroom.core.job.slurm import SlurmJob, slurm_view

    line = JOB.replace("JobState=COMPLETING", "JobState=OUT_OF_MEMORY").replace(
        "ExitCode=0:15", "ExitCode=0:125 DerivedExitCode=0:9"
    )
    info = JobInfo.parse(line)
    down = NodeInfo.parse("NodeName=n2 State=DOWN+DRAIN Reason=disk failed [root@2026-12-06T06:00:00]")
    up = NodeInfo.parse("NodeName=n1 State=IDLE")
    assert info is not None and down is not None and up is not None
    job = SlurmJob(job_id="1", name="slurm-1", info=info, nodes={"n1": up, "n2": down}, readings=[])
    v = {x["code"]: x for x in slurm_view(job, 0.0)["verdicts"]}
    assert "out of memory" in v["SLURM_OUT_OF_MEMORY"]["message"]
    assert v["NODE_LOST"]["node"] == "n2" and "disk failed" in v["NODE_LOST"]["message"]
    assert "killed by signal 9 (SIGKILL)" in v["SLURM_DERIVED_EXIT"]["message"]
    # A RUNNING job whose node's slurmd does not answer: lost before slurmctld says DOWN.
    running = JobInfo.parse(JOB.replace("JobState=COMPLETING", "JobState=RUNNING"))
    assert running is not None
    job = SlurmJob(
        job_id="1",
        name="slurm-1",
        info=running,
        nodes={"n1": up, "n2": up},
        readings=[],
        lost={"n2": "slurmd at 127.0.0.1:17002: Connection refused"},
    )
    lost = [x for x in slurm_view(job, 0.0)["verdicts"] if x["code"] == "NODE_LOST"]
    assert (
        len(lost) == 1
        and "Connection refused" in lost[0]["message"]
        and "SlurmdTimeout" in lost[0]["message"]
    )


def test_bad_slurm_input_is_one_line_and_exit_2() -> None:
    import subprocess
    import sys

    for argv in (["job", "slurm:12;rm"], ["launch", "--checkpoint-signal", "KILL", "--", "true"]):
        out = subprocess.run(
            [sys.executable, "-m", "trainroom.cli", *argv], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, (argv, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2, out.stderr


def test_a_requeued_job_s_wait_is_counted_down() -> None:
    import time

    from trainroom.core.job.slurm import eligible_in_s

    now = time.time()
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now + 100))
    pending = JobInfo.parse(f"JobId=5 JobState=PENDING Reason=BeginTime Restarts=1 EligibleTime={at}")
    assert pending is not None
    left = eligible_in_s(pending, now)
    assert left is not None and 98 <= left <= 101
    assert eligible_in_s(JobInfo.parse(JOB), now) is None
    assert eligible_in_s(JobInfo.parse("JobId=5 JobState=PENDING EligibleTime=Unknown"), now) is None
