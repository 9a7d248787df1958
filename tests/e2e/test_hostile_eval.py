"""Eval gating against hostile evaluations, end to end with the demo trainer under a real keeper:
an evaluation that writes into the checkpoint it was given is held back once (no verify -> eval
loop); a bogus figure (-1e9) is never the best that holds every later checkpoint back; what an
evaluation leaves running is killed when it ends; `trainroom eval` runs the command recorded with
the figure, not today's [eval]."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol as p

TORCH_START_S = 240
PY = shlex.quote(sys.executable)


def _settled(n: int) -> Any:
    def check(info: Any) -> dict[str, Any] | None:
        d = status(info)
        cs = d["checkpoints"]
        done = d["state"] in ("exited", "dead") and len(cs) >= n
        return d if done and all(c["state"] in ("verified", "held", "rejected") for c in cs) else None

    return check


def test_an_evaluation_that_writes_into_its_checkpoint_is_held_once_not_looped(trhome: Path) -> None:
    writes = f'{PY} -c \'import sys; open(sys.argv[1], "ab").write(b"x"); print("eval_loss=1.0")\' {{ckpt}}'
    info = start_demo(steps=20, ckpt_every=20, step_delay=0.0, linger_s=600, extra={"eval_command": writes})
    d = wait_for(lambda: _settled(1)(info), timeout=TORCH_START_S, what="the checkpoint's verdict")
    (c,) = d["checkpoints"]
    assert c["state"] == "held", c
    assert "its evaluation changed 1 file(s) of the checkpoint it was given" in c["reason"]
    evaluating = [
        r
        for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, p.CheckpointState) and r.reason == "evaluating"
    ]
    assert len(evaluating) == 1  # evaluated once, not again and again


def test_a_bogus_figure_is_held_as_implausible_and_never_holds_later_checkpoints_back(
    trhome: Path, tmp_path: Path
) -> None:
    pids = tmp_path / "leftover.pid"
    # Step 40's evaluation prints -1e9; every evaluation leaves a sleeper behind in its session.
    script = tmp_path / "eval.py"
    script.write_text(
        "import subprocess, sys\n"
        f"p = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(pids)!r}, 'a').write(f'{{p.pid}}\\n')\n"
        "step = int(sys.argv[1])\n"
        "print('eval_loss=-1e9' if step == 40 else 'eval_loss=%.3f' % (2.0 - step / 1000))\n"
        "print('train_loss=9.0')\n"  # printed last, never the figure
    )
    cmd = f"{PY} {shlex.quote(str(script))} {{step}}"
    (trhome / "trainroom.toml").write_text(f"[eval]\ncommand = {json.dumps(cmd)}\n")
    info = start_demo(steps=60, ckpt_every=20, step_delay=0.0, linger_s=600)
    d = wait_for(lambda: _settled(3)(info), timeout=TORCH_START_S, what="three verdicts")
    states = {c["step"]: c for c in d["checkpoints"]}
    assert states[20]["state"] == "verified" and states[20]["eval"]["figure"] == 1.98
    assert states[20]["eval"]["figure_name"] == "eval_loss"
    assert (
        states[40]["state"] == "held"
        and "implausible beside this run's 1 other figure(s)" in states[40]["reason"]
    )
    assert states[60]["state"] == "verified" and states[60]["eval"]["figure"] == 1.94
    assert states[60]["eval"]["command"] == cmd
    # Each evaluation's sleeper was killed when the evaluation ended.
    left = [int(x) for x in pids.read_text().split()]
    assert len(left) == 3
    for pid in left:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert all(states[s]["eval"]["leftovers"] == 1 for s in (20, 60))

    # Today's [eval] says something else: `trainroom eval` runs the recorded command all the same.
    (trhome / "trainroom.toml").write_text(
        f"[eval]\ncommand = \"{sys.executable} -c 'print(0.5)' {{ckpt}}\"\n"
    )
    out = run_cli("eval", info.run_id, "--json", timeout=TORCH_START_S)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout)
    assert res["step"] == 60 and res["reproduces"] and res["command"] == cmd
    assert "the command recorded with the figure is run" in res["note"]


NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"


def test_watched_checkpoints_are_gated_by_the_eval_command_too(trhome: Path, tmp_path: Path) -> None:
    from trainroom.core.run.launch import launch

    work = tmp_path / "nanogpt"
    work.mkdir()
    # Version 10 evaluates 1.0 and passes; version 20 evaluates 5.0 and is held: no copy of it.
    gate = f'{PY} -c \'import sys; print("eval_loss=%s" % (1.0 if sys.argv[1] == "10" else 5.0))\' {{step}}'
    info = launch(
        [
            sys.executable,
            str(NANOGPT_LIKE),
            "--iters",
            "20",
            "--save-every",
            "10",
            "--wait-copies",
            "--no-wait-last",
        ],
        {"watch_ckpt": ["out/*.pt"], "keep_verified_copies": True, "eval_command": gate, "linger_s": 600},
        cwd=str(work),
    )
    watched = str(work / "out" / "ckpt.pt")

    def held() -> list[p.CheckpointState] | None:
        recs = [
            r
            for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
            if isinstance(r, p.CheckpointState) and r.state == "held"
        ]
        return recs or None

    (h,) = wait_for(held, timeout=TORCH_START_S + 60, what="version 20 held by its evaluation")
    assert h.path == watched and h.step == 20 and h.eval is not None and h.eval.figure == 5.0
    assert "worse than the best promoted 1 by more than 5 %" in (h.reason or "")
    root = runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)
    assert sorted(x.name for x in root.iterdir() if x.name.startswith("step-")) == ["step-000010"]

    # EVAL_REGRESSED is judged on the keeper's tick after the verdict.
    def regressed() -> dict[str, Any] | None:
        got = status(info)
        return got if "EVAL_REGRESSED" in {f["code"] for f in got["findings"]} else None

    d = wait_for(regressed, timeout=120, what="EVAL_REGRESSED for the held version")
    copy = next(c for c in d["checkpoints"] if c["path"].endswith("step-000010/ckpt.pt"))
    assert copy["state"] == "verified" and copy["eval"]["figure"] == 1.0 and copy["eval"]["passed"]
    out = run_cli("eval", info.run_id, "--json", timeout=TORCH_START_S)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["step"] == 10


DCP_SAVE = Path(__file__).parents[1] / "support" / "ckpt_makers" / "dcp_save.py"


def test_an_evaluation_that_adds_files_to_a_watched_directory_is_evaluated_once(
    trhome: Path, tmp_path: Path
) -> None:
    from trainroom.core.run.launch import launch

    stop = tmp_path / "stop"
    trainer = (
        f"{PY} {shlex.quote(str(DCP_SAVE))} out/step-000010 --step 10 && "
        f"while [ ! -e {shlex.quote(str(stop))} ]; do sleep 0.2; done"
    )
    # As HF's save_metrics does: the evaluation writes its results into the checkpoint it reads.
    writes = f'{PY} -c \'import sys; open(sys.argv[1] + "/eval_results.json", "w").write("ok"); print("eval_loss=1.0")\' {{ckpt}}'
    info = launch(
        ["sh", "-c", trainer],
        {"watch_ckpt": ["out/step-*"], "keep_verified_copies": True, "eval_command": writes, "linger_s": 600},
        cwd=str(tmp_path),
    )
    try:
        watched = str(tmp_path / "out" / "step-000010")
        root = runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)

        def copied() -> bool:
            return (root / "step-000010").is_dir()

        wait_for(copied, timeout=TORCH_START_S, what="the watched directory verified, evaluated and copied")
        moved = Path(info.run_dir) / "eval-output" / "step-000010" / "eval_results.json"
        assert moved.read_text() == "ok" and not (Path(watched) / "eval_results.json").exists()
        assert not (root / "step-000010" / "eval_results.json").exists()  # the copy is what was verified

        def evaluations() -> int:
            return sum(
                1
                for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
                if isinstance(r, p.CheckpointState) and r.path == watched and r.reason == "evaluating"
            )

        # The watch polls each second and settles in a few: a loop would evaluate again by now.
        deadline = wait_for(
            lambda: status(info)["keeper"] == "alive" and status(info), timeout=60, what="status"
        )
        assert deadline
        import time

        time.sleep(8)  # a loop, if any, has had several polls to show itself
        assert evaluations() == 1
    finally:
        stop.touch()
