"""The figure an evaluation printed: linear time on bounded lines (hostile output: a MiB of digits
or underscores on one line), and the evaluation's own loss by name precedence (`eval_loss` over a
bare `loss` over `train_loss`), whatever was printed last."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from trainroom.core.ops.evaluate import figure_in
from trainroom.core.ops.figures import MAX_FIGURE_LINE, default_figure, find_figure


def test_eval_loss_wins_over_a_train_loss_printed_after_it() -> None:
    out = "{'eval_loss': 0.1, 'eval_runtime': 1.2}\n{'train_loss': 9.0, 'train_runtime': 3.0}\n"
    f = default_figure(out)
    assert f is not None and f.value == 0.1 and f.name == "eval_loss"
    assert figure_in("loss: 2.5\nval loss 1.7\nloss 3.0\n") == 1.7
    assert figure_in("step 10 loss 2.5\nstep 20 loss 2.0\n") == 2.0  # one kind: the last wins
    assert figure_in("train_loss=4.0\n") == 4.0  # a training figure when it is all there is
    assert figure_in("gloss=1.0\n") is None  # inside a longer word
    assert figure_in('"eval_loss": 2.31, "lr": 3e-4') == 2.31
    assert figure_in("eval_loss=nan") != figure_in("eval_loss=nan")  # NaN is a verdict, kept


def test_a_line_longer_than_the_bound_is_not_searched_and_a_pattern_is_read_per_line() -> None:
    assert figure_in("x" * MAX_FIGURE_LINE + " eval_loss=1.0\neval_loss=2.0\n") == 2.0
    f = find_figure("ppl 12.5\nscore=0.75\n", r"score=(\S+)")
    assert f is not None and f.value == 0.75 and f.name == "pattern"


def test_hostile_megabyte_lines_are_read_in_bounded_time() -> None:
    # Each of these took minutes to hours under the old single pattern (quadratic: 70,000
    # underscores took 67.7 s in the keeper). The subprocess bound only keeps a regression from
    # hanging the suite; scripts/bench_figures.py measures it.
    code = textwrap.dedent(
        """
        from trainroom.core.ops.evaluate import figure_in
        mib = 1 << 20
        for line in ("_" * mib, "9" * mib, " " * mib, "loss" + " " * mib, "loss=" + "9" * mib,
                     "a_" * (mib // 2), "loss_" * (mib // 5), "eval_" * (mib // 5) + "loss=1"):
            for text in (line, line + "\\neval_loss=0.5\\n"):
                got = figure_in(text)
                assert got in (None, 0.5), (line[:20], got)
                assert figure_in(text, r"(?P<loss>[0-9.]+)$") in (None, 0.5)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_a_bogus_best_is_not_held_against_a_plausible_figure() -> None:
    from trainroom.core.configuration.config import Eval
    from trainroom.core.ops.evaluate import judge

    pol = Eval(command="x", margin=0.05)
    ok, why = judge(2.0, -1e9, pol, history=[-1e9])
    assert ok and "the best promoted figure -1e+09 is implausible" in why
    ok, why = judge(-1e9, 2.0, pol, history=[2.1, 2.0])
    assert not ok and why.startswith("evaluated -1e+09, implausible beside this run's 2 other figure(s)")
    assert judge(0.5, 2.0, pol, history=[2.1, 2.0])[0]  # a real improvement is plausible
    assert not judge(2.5, 2.0, pol, history=[2.0])[0]  # worse by more than the margin: held


def test_files_an_evaluation_adds_to_a_directory_checkpoint_are_moved_out(tmp_path: Path) -> None:
    from trainroom.core.keeper.evaltree import move_out, tree_state

    ck = tmp_path / "checkpoint-20"
    ck.mkdir()
    (ck / "model.safetensors").write_bytes(b"w" * 10)
    before = tree_state(str(ck))
    (ck / "eval_results.json").write_text("{}")
    (ck / "runs").mkdir()
    (ck / "runs" / "events").write_text("e")
    after = tree_state(str(ck))
    added = sorted(k for k in after if k not in before)
    assert added == ["eval_results.json", "runs", "runs/events"]
    assert move_out(ck, added, tmp_path / "out") == 2
    assert tree_state(str(ck)) == before
    assert (tmp_path / "out" / "runs" / "events").read_text() == "e"
