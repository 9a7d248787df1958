"""Plans and results in words and units: what a person reads before saying yes, and after."""

from __future__ import annotations

from trainroom.core.actions import words
from trainroom.core.actions.registry import REGISTRY
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
    lines = REGISTRY["prune"].plan_lines(plan)
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
    lines = REGISTRY["kill"].plan_lines(plan)
    assert lines[0] == "  SIGTERM to process group 40 (2 process(es)), SIGKILL to any left after 10 s"
    assert lines[1] == "  then waits up to 50 s for the GPU memory to be released"
    assert lines[2] == "  loses 17 step(s): at step 137, last verified checkpoint at step 120"
    assert "    pid 40  python train.py" in lines and "  left alone: pid 50 (not the run's)" in lines
    none_yet = REGISTRY["kill"].plan_lines(plan | {"last_verified_step": None})
    assert "  loses all 137 step(s): no verified checkpoint yet (a resume starts from scratch)" in none_yet
    # An attempt that ended whole: nothing to signal, and no "refused" beside the result's verdict.
    gone = plan | {
        "members": [],
        "refusals": ["process group 40 has no live members"],
        "nothing_left": True,
        "empty": True,
    }
    lines = REGISTRY["kill"].plan_lines(gone)
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
    lines = REGISTRY["reclaim"].plan_lines(plan)
    assert lines[0].startswith("  drops the whole machine's page cache (8.0 GiB now)")
    assert "  not used: memory.reclaim: not writable" in lines
    cg = REGISTRY["reclaim"].plan_lines(plan | {"method": "cgroup2-memory.reclaim", "cgroup": "/user.slice"})
    assert "whole machine" not in cg[0] and "/user.slice" in cg[0]


def test_an_action_without_its_own_words_shows_fields_in_words() -> None:
    lines = REGISTRY["bench"].plan_lines({"device": "cpu", "seconds_s": 2.0, "ok": True})
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
