"""`launch` recognises the framework a command's script is built on (core/logs/frameworks) and offers
the resume template that fits; --resume-template and trainroom.toml still win (settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainroom.core.configuration.config import Config, Resume
from trainroom.core.configuration.settings import LaunchOptions, resolve
from trainroom.core.logs.frameworks import recognise, script_of
from trainroom.core.ops.resume import resume_argv

TRAINERS = Path(__file__).resolve().parents[1] / "support" / "trainers"
NANOGPT = """\
init_from = 'scratch'
out_dir = 'out'
exec(open('configurator.py').read())
if init_from == 'resume':
    pass
"""
LIGHTNING_CLI = "from lightning.pytorch.cli import LightningCLI\nLightningCLI(Model)\n"


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["python", "train.py", "--lr", "1"], "train.py"),
        (["/usr/bin/python3.11", "-u", "-W", "ignore", "train.py"], "train.py"),
        (["torchrun", "--nproc_per_node=2", "--standalone", "train.py", "--x"], "train.py"),
        (["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], "train.py"),
        (["accelerate", "launch", "--num_processes", "2", "train.py"], "train.py"),
        (["env", "A=1", "python", "train.py"], "train.py"),
        (["python", "-m", "mypkg.train"], None),
        (["./run.sh"], None),
    ],
)
def test_the_script_is_found_past_interpreters_and_launchers(argv: list[str], script: str | None) -> None:
    assert script_of(argv) == script


def test_an_hf_script_gets_resume_from_checkpoint_and_the_given_one_is_replaced(tmp_path: Path) -> None:
    argv = [
        "python",
        str(TRAINERS / "hf_train.py"),
        "--output_dir",
        "o{x}",
        "--resume_from_checkpoint",
        "old",
    ]
    r = recognise(argv, str(tmp_path))
    assert r is not None and r.framework == "hf" and r.resume_template is not None
    ckpt = tmp_path / "checkpoint-140"
    ckpt.mkdir()
    filled = resume_argv(r.resume_template, ckpt=str(ckpt), step=140)
    # Braces the user wrote stay as written; only trainroom's placeholders are filled.
    assert filled == ["python", argv[1], "--output_dir", "o{x}", "--resume_from_checkpoint", str(ckpt)]


def test_nanogpt_gets_init_from_resume_in_its_out_dir(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NANOGPT)
    r = recognise(
        ["torchrun", "--nproc_per_node=2", "train.py", "--init_from=scratch", "--batch_size=4"], str(tmp_path)
    )
    assert r is not None and r.framework == "nanogpt" and r.resume_template is not None
    out = tmp_path / "out"
    out.mkdir()
    filled = resume_argv(r.resume_template, ckpt=str(out / "ckpt.pt"))
    assert filled == [
        "torchrun",
        "--nproc_per_node=2",
        "train.py",
        "--batch_size=4",
        "--init_from=resume",
        f"--out_dir={out}",
    ]


def test_a_lightning_cli_fit_gets_ckpt_path_and_a_plain_lightning_script_a_hint(tmp_path: Path) -> None:
    (tmp_path / "cli.py").write_text(LIGHTNING_CLI)
    r = recognise(["python", "cli.py", "fit", "--config", "c.yaml"], str(tmp_path))
    assert r is not None and r.resume_template == "python cli.py fit --config c.yaml --ckpt_path {ckpt}"
    r = recognise(["python", "cli.py", "validate"], str(tmp_path))
    assert r is not None and r.resume_template is None and "fit" in (r.note or "")
    r = recognise(["python", str(TRAINERS / "lightning_train.py"), "--out", "o"], str(tmp_path))
    assert r is not None and r.framework == "lightning" and r.resume_template is None
    assert "TRAINROOM_RESUME" in (r.note or "")


def test_an_unknown_or_unreadable_script_is_not_recognised(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("print('hello')\n")
    assert recognise(["python", "plain.py"], str(tmp_path)) is None
    assert recognise(["python", "missing.py"], str(tmp_path)) is None
    assert recognise(["sleep", "1"], str(tmp_path)) is None


def settings_for(tmp_path: Path, options: LaunchOptions, config: Config) -> tuple[str | None, str | None]:
    (tmp_path / "train.py").write_text(NANOGPT)
    s = resolve(
        options, config, cwd=str(tmp_path), run_dir=tmp_path / "run", env={}, argv=["python", "train.py"]
    )
    return s.resume_template, s.resume_template_from


def test_the_flag_then_the_toml_then_the_recognised_template(tmp_path: Path) -> None:
    flag = LaunchOptions(resume_template="python train.py --mine {ckpt}")
    toml = Config(resume=Resume(command="python train.py --toml {ckpt}"))
    assert settings_for(tmp_path, flag, toml) == ("python train.py --mine {ckpt}", "--resume-template")
    assert settings_for(tmp_path, LaunchOptions(), toml) == (
        "python train.py --toml {ckpt}",
        "trainroom.toml",
    )
    template, source = settings_for(tmp_path, LaunchOptions(), Config())
    assert template == "python train.py --init_from=resume --out_dir={ckpt_dir}"
    assert source is not None and source.startswith("recognised: nanoGPT")


HF_SCRIPT = "from transformers import HfArgumentParser, TrainingArguments\n"
LIGHTNING_SCRIPT = "import lightning as L\n"


@pytest.mark.parametrize(
    ("source", "args", "every", "evidence"),
    [
        (HF_SCRIPT, ["--logging_steps", "10"], 10, "--logging_steps 10 in the command"),
        (HF_SCRIPT, ["--logging_steps=25"], 25, "--logging_steps 25 in the command"),
        (HF_SCRIPT + "args.logging_steps = 50\n", [], 50, "logging_steps=50 in the script"),
        (HF_SCRIPT, [], 500, "logging_steps is not set: the default 500"),
        (HF_SCRIPT, ["config.json"], None, ""),  # the file may set it
        (HF_SCRIPT + "n = args.logging_steps\n", [], None, ""),  # set some other way
        (HF_SCRIPT, ["--logging_steps", "0.1"], None, ""),  # a ratio of the run, not a spacing
        (HF_SCRIPT, ["--logging_strategy", "epoch"], None, ""),
        # Built in code: no template, the hints all the same.
        (
            "import transformers\nTrainingArguments(logging_steps=10)\n",
            [],
            10,
            "logging_steps=10 in the script",
        ),
    ],
)
def test_hf_logging_steps_are_read_from_the_command_or_the_script(
    tmp_path: Path, source: str, args: list[str], every: int | None, evidence: str
) -> None:
    (tmp_path / "train.py").write_text(source)
    r = recognise(["python", "train.py", *args], str(tmp_path))
    assert r is not None and r.framework == "hf"
    assert (r.resume_template is None) is ("HfArgumentParser" not in source)
    assert (r.log_hints.logging_steps, r.log_hints.evidence) == (every, evidence)


@pytest.mark.parametrize(
    ("source", "args", "accumulate"),
    [
        (LIGHTNING_SCRIPT + "L.Trainer(accumulate_grad_batches=4)\n", [], 4),
        (
            LIGHTNING_SCRIPT + "L.Trainer(accumulate_grad_batches=a.acc)\n",
            ["--accumulate_grad_batches", "8"],
            8,
        ),
        (LIGHTNING_SCRIPT + "L.Trainer(accumulate_grad_batches=a.acc)\n", [], None),
        (LIGHTNING_SCRIPT + "L.Trainer()\n", [], 1),
        (LIGHTNING_SCRIPT + "from x import GradientAccumulationScheduler\n", [], None),
        (LIGHTNING_CLI, ["fit", "--trainer.accumulate_grad_batches=2"], 2),
        (LIGHTNING_CLI, ["fit", "--config", "c.yaml"], None),
    ],
)
def test_lightning_accumulation_is_read_from_the_command_or_the_script(
    tmp_path: Path, source: str, args: list[str], accumulate: int | None
) -> None:
    (tmp_path / "train.py").write_text(source)
    r = recognise(["python", "train.py", *args], str(tmp_path))
    assert r is not None and r.framework == "lightning"
    assert r.log_hints.accumulate == accumulate
    argv = ["python", "train.py", *args]
    settings = resolve(
        LaunchOptions(), Config(), cwd=str(tmp_path), run_dir=tmp_path / "run", env={}, argv=argv
    )
    assert settings.log_hints == r.log_hints  # what the keeper's log reader is given
