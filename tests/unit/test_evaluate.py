"""Promotion gated by the trainer's own evaluation: the figure read from what an evaluation prints,
the judgement against the best promoted figure, a real evaluation process (its exit code, its
timeout killing its whole process group, one that cannot start), and the [eval] section's checks."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import wait_for
from trainroom.core.configuration.config import Eval, load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.ops.evaluate import better, evaluate, figure_in, judge
from trainroom.core.ops.resume import resume_argv

PY = shlex.quote(sys.executable)


@pytest.mark.parametrize(
    ("text", "figure"),
    [
        ("eval_loss=2.31\n", 2.31),
        ('{"eval_loss": 2.5, "epoch": 1.0}', 2.5),
        ("{'eval_loss': 0.5, 'eval_runtime': 3.2}", 0.5),
        ("val loss 2.31\nval loss 1.9\n", 1.9),  # the last one wins
        ("step 3: loss 4e-3", 0.004),
        ("INFO eval | loss: nan", math.nan),
        ("val_loss=inf", math.inf),
        ("glossary 3\naccuracy 0.9\n", None),  # no loss-like name: no figure
    ],
)
def test_the_figure_is_the_last_loss_like_number(text: str, figure: float | None) -> None:
    got = figure_in(text)
    if figure is None:
        assert got is None
    elif math.isnan(figure):
        assert got is not None and math.isnan(got)
    else:
        assert got == figure


def test_a_pattern_reads_its_loss_group_else_its_first_group() -> None:
    assert figure_in("acc=0.91 acc=0.93", r"acc=(\S+)") == 0.93
    assert figure_in("ppl 12.5 (loss 2.52)", r"ppl (?P<loss>\S+)") == 12.5
    assert figure_in("nothing here", r"ppl (?P<loss>\S+)") is None


def test_judge_holds_what_regresses_past_the_margin_and_what_is_not_finite() -> None:
    policy = Eval(command="x {ckpt}", margin=0.05)
    assert judge(2.0, None, policy)[0]  # the first figure of a run passes
    assert judge(2.09, 2.0, policy)[0]  # within 5 %
    ok, why = judge(2.11, 2.0, policy)
    assert not ok and "worse than the best promoted 2 by more than 5 %" in why
    assert not judge(math.nan, 2.0, policy)[0]
    assert not judge(math.inf, None, policy)[0]
    assert judge(None, 2.0, policy) == (False, "its evaluation printed no figure")
    acc = Eval(command="x {ckpt}", margin=0.05, lower_is_better=False)
    assert judge(0.86, 0.9, acc)[0] and not judge(0.85, 0.9, acc)[0]
    assert better(1.0, 2.0, policy) and not better(1.0, 2.0, acc) and better(1.0, None, acc)


def _policy(code: str, **kw: float) -> Eval:
    return Eval(command=f"{PY} -c {shlex.quote(code)} {{ckpt}} {{step}}", **kw)  # type: ignore[arg-type]


def test_a_real_evaluation_gets_the_checkpoint_and_step_and_is_judged(tmp_path: Path) -> None:
    ckpt = tmp_path / "step 7.pt"  # a space in the path stays one argument
    ckpt.write_text("x")
    code = "import sys, os; print('ckpt', os.path.exists(sys.argv[1]), 'step', sys.argv[2]); print('eval_loss=2.5')"
    got = evaluate(_policy(code), str(ckpt), step=7, run_id="r", cwd=str(tmp_path), best=2.0)
    assert got.figure == 2.5 and got.exit_code == 0 and not got.passed and got.best == 2.0
    assert "worse than the best promoted 2" in got.why
    got = evaluate(_policy(code), str(ckpt), step=7, run_id="r", cwd=str(tmp_path), best=2.45)
    assert got.passed and got.figure == 2.5


def test_an_evaluation_that_fails_or_prints_nan_holds_the_candidate(tmp_path: Path) -> None:
    failed = evaluate(
        _policy("import sys; print('CUDA error: out of memory'); sys.exit(3)"),
        "c",
        step=1,
        run_id="r",
        cwd=str(tmp_path),
        best=None,
    )
    assert not failed.passed and failed.exit_code == 3
    assert failed.why == "its evaluation failed (exit code 3): CUDA error: out of memory"
    nan = evaluate(_policy("print('eval_loss=nan')"), "c", step=1, run_id="r", cwd=str(tmp_path), best=None)
    assert not nan.passed and nan.figure is None and nan.why == "its evaluation gave nan"
    gone = evaluate(
        Eval(command="/nonexistent/eval {ckpt}"), "c", step=1, run_id="r", cwd=str(tmp_path), best=None
    )
    assert not gone.passed and gone.why.startswith("its evaluation could not start: /nonexistent/eval")


def test_an_evaluation_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    # The evaluation starts a child that would outlive it, then hangs.
    code = (
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(marker)!r}, 'w').write(str(c.pid)); time.sleep(600)"
    )
    got = evaluate(_policy(code, timeout_s=3.0), "c", step=1, run_id="r", cwd=str(tmp_path), best=None)
    assert not got.passed and got.why == "its evaluation ran past 3 s and was killed"
    child = int(marker.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A zombie not reaped yet by init is gone as far as work goes.
        with open(f"/proc/{child}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(gone, timeout=30, what="the evaluation's child killed with its group")


def test_an_evaluation_runs_at_low_priority(tmp_path: Path) -> None:
    got = evaluate(
        _policy("import os; print('nice', os.nice(0), 'eval_loss=1.0')"),
        "c",
        step=1,
        run_id="r",
        cwd=str(tmp_path),
        best=None,
    )
    assert got.passed and got.figure == 1.0
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True, check=True
    )
    assert int(out.stdout) < 19  # this process is not already at the floor, so the check proves something


def test_the_eval_section_is_checked_like_the_resume_command(tmp_path: Path) -> None:
    p = tmp_path / "trainroom.toml"
    p.write_text('[eval]\ncommand = "python eval.py {checkpoint}"\n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, tmp_path / "nostate")
    assert str(err.value) == (
        f"{p}: eval.command: expected placeholders among {{ckpt}}, {{ckpt_dir}}, {{step}}, {{run_id}}, got {{checkpoint}}"
    )
    p.write_text('[eval]\ncommand = "python eval.py {ckpt}"\npattern = "loss=("\n')
    with pytest.raises(ConfigError, match=r"eval\.pattern: expected a regular expression"):
        load_config(tmp_path, tmp_path / "nostate")
    p.write_text('[eval]\ncommand = "python eval.py {ckpt}"\nmargin = -1\n')
    with pytest.raises(ConfigError, match=r"eval\.margin"):
        load_config(tmp_path, tmp_path / "nostate")
    p.write_text('[eval]\ncommand = "python eval.py {ckpt}"\nmargin = 0.1\nlower_is_better = false\n')
    cfg, _ = load_config(tmp_path, tmp_path / "nostate")
    assert cfg.eval == Eval(command="python eval.py {ckpt}", margin=0.1, lower_is_better=False)


def test_launch_refuses_a_bad_eval_command_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "TRAINROOM_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "launch", "--eval-command", "eval {nope}", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines() == [
        "trainroom: error: --eval-command: expected placeholders among {ckpt}, {ckpt_dir}, {step}, {run_id}, got {nope}"
    ]


def test_literal_braces_in_an_eval_command_are_kept_and_only_placeholders_filled(tmp_path: Path) -> None:
    """`print({})` and JSON in the command are the command's own braces: trainroom.toml takes the
    command, and the real evaluation gets them as written, with {ckpt} and {step} filled."""
    ckpt = tmp_path / "step-000007"
    ckpt.mkdir()
    code = (
        "import json, sys; print({}); opts = json.loads(sys.argv[1]); "
        "print('got', opts['a']['b'], sys.argv[2], sys.argv[3]); print(json.dumps({'eval_loss': 1.5}))"
    )
    command = f'{PY} -c {shlex.quote(code)} \'{{"a": {{"b": 1}}}}\' {{ckpt}} {{step}}'
    toml = tmp_path / "trainroom.toml"
    toml.write_text(f"[eval]\ncommand = {json.dumps(command)}\n")
    cfg, _ = load_config(tmp_path, tmp_path / "nostate")
    assert cfg.eval.command == command
    got = evaluate(cfg.eval, str(ckpt), step=7, run_id="r", cwd=str(tmp_path), best=None)
    assert got.passed and got.figure == 1.5, got.why
    argv = resume_argv(command, ckpt=str(ckpt), step=7)
    assert argv[3:] == ['{"a": {"b": 1}}', str(ckpt), "7"]
    assert resume_argv("run {ckpt} {}", ckpt="/c/{step}", step=3) == ["run", "/c/{step}", "{}"]  # one pass
    toml.write_text('[eval]\ncommand = "python eval.py {ckpt_path} {}"\n')  # a typo is still refused
    with pytest.raises(ConfigError, match=r"got \{ckpt_path\}"):
        load_config(tmp_path, tmp_path / "nostate")
