"""Plans and results in words and units: what a person reads before saying yes, and after."""

from __future__ import annotations

from trainroom.core.actions import render, words
from trainroom.core.cli.act import verdict

GiB = 1024**3


def test_evidence_says_units_not_reprs() -> None:
    line = words.evidence(
        {
            "members": 0,
            "pids": [11, 12],
            "vram_bytes": 2 * GiB,
            "vram_wait_s": 3.25,
            "survivors": [{"pid": 1, "cmdline": ["python"]}],
            "released": True,
            "ok": True,
            "unknown_thing": None,
        }
    )
    assert line == "members 0, pids 11, 12, vram 2.0 GiB, vram wait 3.2 s, survivors 1, released yes"
    assert "{" not in line and "[" not in line


def test_a_prune_plan_says_counts_and_what_is_kept_before_any_path() -> None:
    delete = [
        {"step": s, "path": f"/ck/step-{s:06d}", "bytes": GiB, "kind": "verified"} for s in range(90, 0, -1)
    ]
    plan = {
        "root": "/ck",
        "keep": 2,
        "bytes_to_free": 90 * GiB,
        "delete": delete,
        "kept": [{"step": 92, "path": "/ck/step-000092", "why": "latest"}],
        "skipped": [],
    }
    lines = render.plan_lines("prune", plan)
    assert lines[0] == "  deletes 90 checkpoint(s) under /ck, 90.0 GiB freed"
    assert lines[1] == "  keeps 1: step 92 (latest)"
    assert all("/ck/step-" in x for x in lines[2:]) and len(lines) == 92


def test_a_kill_plan_says_the_signals_the_grace_and_the_steps_lost() -> None:
    plan = {
        "pgid": 40,
        "members": [{"pid": 40, "cmdline": ["python", "train.py"]}, {"pid": 41, "cmdline": ["python"]}],
        "strangers": [{"pid": 50, "why": "not the run's"}],
        "refusals": [],
        "ok": True,
        "nothing_left": False,
        "empty": False,
        "label": "",
        "grace_s": 10.0,
        "vram_timeout_s": 50.0,
        "step": 137,
        "last_verified_step": 120,
    }
    lines = render.plan_lines("kill", plan)
    assert lines[0] == "  SIGTERM to process group 40 (2 process(es)), SIGKILL to any left after 10 s"
    assert lines[1] == "  then waits up to 50 s for the GPU memory to be released"
    assert lines[2] == "  loses 17 step(s): at step 137, last verified checkpoint at step 120"
    assert "    pid 40  python train.py" in lines and "  left alone: pid 50 (not the run's)" in lines
    # No driver view (a CPU run, NVML missing): no wait for GPU memory is promised.
    blind = render.plan_lines(
        "kill",
        plan
        | {"vram_timeout_s": None, "vram_unseen": "driver view unavailable: NVML Shared Library Not Found"},
    )
    assert blind[1] == (
        "  the GPU memory's release is not waited for (driver view unavailable: NVML Shared Library Not Found)"
    )
    assert not any("waits up to" in x for x in blind)
    none_yet = render.plan_lines("kill", plan | {"last_verified_step": None})
    assert "  loses all 137 step(s): no verified checkpoint yet (a resume starts from scratch)" in none_yet
    # An attempt that ended whole: nothing to signal, and no "refused" beside the result's verdict.
    gone = plan | {
        "members": [],
        "refusals": ["process group 40 has no live members"],
        "nothing_left": True,
        "empty": True,
    }
    lines = render.plan_lines("kill", gone)
    assert lines[0] == "  nothing of process group 40 is left to signal"
    assert not any("refused" in x or "loses" in x for x in lines)


def test_reclaim_by_drop_caches_says_it_drops_the_whole_machines_cache() -> None:
    plan = {
        "method": "drop_caches",
        "target": "/proc/sys/vm/drop_caches",
        "value": "1",
        "page_cache_bytes": 8 * GiB,
        "passed_over": ["memory.reclaim: not writable"],
    }
    lines = render.plan_lines("reclaim", plan)
    assert lines[0].startswith("  drops the whole machine's page cache (8.0 GiB now)")
    assert "  not used: memory.reclaim: not writable" in lines
    cg = render.plan_lines("reclaim", plan | {"method": "cgroup2-memory.reclaim", "cgroup": "/user.slice"})
    assert "whole machine" not in cg[0] and "/user.slice" in cg[0]


def test_an_action_without_its_own_words_shows_fields_in_words() -> None:
    lines = render.plan_lines("bench", {"device": "cpu", "python": "/usr/bin/python3", "ok": True})
    assert lines == ["  device: cpu", "  python: /usr/bin/python3"]
    # A plan no action here reads (an action this code does not know): its fields in words.
    lines = render.plan_lines("nosuch", {"device": "cpu", "seconds_s": 2.0, "ok": True})
    assert lines == ["  device: cpu", "  seconds: 2.0 s"]


def test_one_verdict_said_once() -> None:
    assert verdict("resume", False, "resume refused: no verified checkpoint", {}) == (
        "resume refused: no verified checkpoint"
    )
    assert (
        verdict("kill", False, "the driver still holds 5 GiB", {}) == "refused: the driver still holds 5 GiB"
    )
    assert verdict("kill", True, "nothing left to kill", {}) == "ok: nothing left to kill"
    assert verdict("bench", True, "4 TFLOP/s", {"verdict": "slow"}) == "slow: 4 TFLOP/s"


def test_status_text_rounds_its_figures() -> None:
    from trainroom.core.run.status_text import status_lines

    d = {
        "run": "r1",
        "state": "running",
        "exit": {"code": None, "signal": None},
        "attempt": 1,
        "pid": 7,
        "keeper": "alive",
        "step": 40,
        "step_age_s": 0.31234,
        "steps_per_s": 13.5138,
        "loss": 2.5,
        "lr": {"effective": [0.000312345], "requested": 0.0003},
        "vram": {"driver_available": False, "driver_reason": None},
        "host": {"mem_available_bytes": 4 * GiB, "page_cache_bytes": GiB},
        "disk": {"used_fraction": 0.2927},
        "findings": [],
    }
    text = "\n".join(status_lines(d))
    assert "13.5 steps/s" in text and "age 0.3 s" in text and "lr 0.000312 (asked 0.0003)" in text
    assert "disk 29% used" in text and "0.2927" not in text
    unknown = "\n".join(status_lines(d | {"steps_per_s": None, "step_age_s": None}))
    assert "? steps/s" in unknown and "age ? s" in unknown


def test_each_confirmation_opens_with_one_line_of_what_happens_and_what_is_lost() -> None:
    kill = {
        "pgid": 40,
        "members": [{"pid": 40, "cmdline": ["python"]}, {"pid": 41, "cmdline": ["python"]}],
        "grace_s": 10.0,
        "step": 137,
        "last_verified_step": 120,
    }
    assert render.headline("kill", kill, "") == (
        "kills process group 40 (2 processes, SIGTERM, then SIGKILL after 10 s); "
        "loses 17 steps (at step 137, last verified checkpoint at step 120)"
    )
    assert render.headline("kill", kill | {"last_verified_step": None}, "").endswith(
        "; loses all 137 steps: no verified checkpoint yet"
    )
    assert render.headline("kill", kill | {"members": []}, "") == (
        "nothing of process group 40 is left to kill: only checks the GPU memory was released; "
        "nothing is lost"
    )
    targeted = kill | {"pgid": 0, "label": "pid 77, the other trainer", "finding": "DUPLICATE_TRAINER:x"}
    assert render.headline("kill", targeted, "") == (
        "kills pid 77, the other trainer (2 processes, SIGTERM, then SIGKILL after 10 s), "
        "what DUPLICATE_TRAINER:x names; the trainer is left alone"
    )
    prune = {
        "root": "/ck",
        "bytes_to_free": 3 * GiB,
        "delete": [{"step": s, "path": f"/ck/{s}", "bytes": GiB} for s in (30, 10, 20)],
        "kept": [{"step": 40, "why": "latest"}],
    }
    assert render.headline("prune", prune, "") == (
        "deletes 3 checkpoints (steps 10 to 30) under /ck for good, 3.0 GiB freed; keeps 1"
    )
    reclaim = {
        "method": "drop_caches",
        "target": "/proc/sys/vm/drop_caches",
        "value": "1",
        "page_cache_bytes": 6 * GiB,
    }
    assert render.headline("reclaim", reclaim, "").startswith(
        "drops the whole machine's page cache (6.0 GiB), every process's"
    )
    resume = {"attempt": 2, "checkpoint": "/ck/300", "step": 300, "died_at_step": 322, "steps_lost": 22}
    assert render.headline("resume", resume, "") == (
        "starts attempt 2 from /ck/300 (step 300); the 22 steps after it, up to step 322, are trained again"
    )
    woken = {"pgid": 40, "members": [{"pid": 40, "cmdline": ["python", "t.py"]}]}
    assert render.headline("continue", woken, "").startswith("sends SIGCONT to 1 stopped process ")
    assert render.plan_lines("continue", woken) == ["    pid 40  python t.py"]
    # An action without a headline of its own opens with the keeper's summary.
    assert render.headline("verify", {"path": "/ck/300"}, "verify /ck/300") == "verify /ck/300"


def test_an_outcome_is_said_in_words_once() -> None:
    assert words.outcome("kill", True, "gone", {}) == "kill: done"
    assert words.outcome("kill", False, "cancelled the wait for VRAM after 3 s", {}) == "kill: cancelled"
    # The processes are gone but the driver still holds their memory: not "not done".
    assert words.outcome("kill", False, "gone; but the driver still holds", {"members": 0}) == (
        "kill: done in part"
    )
    assert words.outcome("resume", False, "resume refused: no checkpoint", {}) == "resume: refused"
    assert words.outcome("verify", False, "the keeper could not be reached", {}) == "verify: not done"
    assert verdict("resume", False, "resume refused: no checkpoint", {}) == "resume refused: no checkpoint"


def test_a_dumps_stacks_are_blocks_labelled_by_rank_never_inline_figures() -> None:
    after = {
        "method": "faulthandler",
        "ranks": [
            {
                "rank": 0,
                "pid": 11,
                "method": "faulthandler",
                "message": "",
                "stacks": "Thread 0x1\n  File a\n",
            },
            {"rank": 1, "pid": 12, "method": None, "message": "pid 12 is stopped", "stacks": ""},
        ],
    }
    assert words.blocks(after) == [
        ("rank 0 (pid 11), read by faulthandler", "Thread 0x1\n  File a\n"),
        ("rank 1 (pid 12)", "(pid 12 is stopped)"),
    ]
    assert words.evidence(after) == "method faulthandler"
    one = {"method": "py-spy", "stacks": "Thread 1\n  main\n"}
    assert words.blocks(one) == [("stacks (read by py-spy)", "Thread 1\n  main\n")]
    assert words.evidence(one) == "method py-spy"
