"""Which framework a trainer command is built on, and the resume template that fits it.

`launch` runs `recognise(argv, cwd)` when neither `--resume-template` nor trainroom.toml's
`[resume] command` names one: it finds the script the command runs (through `python`, `torchrun`,
`python -m torch.distributed.run` or `accelerate launch`), reads its source, and offers

- Hugging Face, a script that parses `TrainingArguments` with `HfArgumentParser`: the command
  with `--resume_from_checkpoint {ckpt_dir}` (the `checkpoint-N/` directory); one that builds
  them in code is recognised with no template (its options are its own);
- nanoGPT's train.py (its `configurator.py` and `init_from`): `--init_from=resume --out_dir={ckpt_dir}`;
- a `LightningCLI` script run with `fit`: `--ckpt_path {ckpt}`. A plain Lightning script takes
  `ckpt_path` in code (`trainer.fit(model, ckpt_path=os.environ.get("TRAINROOM_RESUME"))`), so no
  template is offered: the checkpoint reaches it in TRAINROOM_RESUME.

It also reads how the trainer's log counts (LogHints, for the log recognisers): HF's
`logging_steps` (a logged dict every N optimizer steps) and Lightning's `accumulate_grad_batches`
(batches per optimizer step), from the command's options, else a literal in the script, else the
framework's default when the script never names them; a value set any other way is not known.

Only the first MAX_SOURCE_BYTES of the script are read; a script that cannot be read is not
recognised (the run goes on without a template, as before).
"""

from __future__ import annotations

import os
import re
import shlex

import msgspec

from trainroom.core.logs.loglines import LogHints

MAX_SOURCE_BYTES = 512 << 10
_PYTHON = re.compile(r"^python[\d.]*$")
_LAUNCHERS = ("torchrun",)
# Short options of python that take a value as the next word.
_VALUE_OPTS = frozenset({"-W", "-X"})


class Recognised(msgspec.Struct, kw_only=True, frozen=True):
    framework: str  # hf, lightning, nanogpt
    script: str  # the script as the command names it
    evidence: str  # what in the source said so, in words
    resume_template: str | None = None
    # Why there is no template, or how the trainer must take the checkpoint.
    note: str | None = None
    # How its log counts steps, where the command or script says (core/logs/logformats).
    log_hints: LogHints = msgspec.field(default_factory=LogHints)


def script_of(argv: list[str]) -> str | None:
    """The Python script a command runs, past the interpreter and launchers and their options."""
    words = list(argv)
    while words:
        head = os.path.basename(words[0])
        if _PYTHON.match(head) or head in _LAUNCHERS:
            words = _skip_options(words[1:])
            if words[:2] == ["-m", "torch.distributed.run"] or words[:2] == [
                "-m",
                "torch.distributed.launch",
            ]:
                words = _skip_options(words[2:])
            elif words[:1] == ["-m"]:
                return None  # a module: no script path to read
            continue
        if head == "accelerate" and words[1:2] == ["launch"]:
            words = _skip_options(words[2:])
            continue
        if head == "env":
            words = words[1:]
            while words and ("=" in words[0] or words[0].startswith("-")):
                words = words[1:]
            continue
        return words[0] if words[0].endswith(".py") else None
    return None


def _skip_options(words: list[str]) -> list[str]:
    """Past the options: `--opt=value`, a known `-W value`, and `--opt value` where the value is
    not itself an option or a script (`--standalone train.py` keeps the script)."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-m":
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        takes_value = w in _VALUE_OPTS or (
            w.startswith("--")
            and "=" not in w
            and nxt
            and not nxt.startswith("-")
            and not nxt.endswith(".py")
        )
        i += 2 if takes_value else 1
    return words[i:]


def _source(script: str, cwd: str) -> str | None:
    path = script if os.path.isabs(script) else os.path.join(cwd, script)
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SOURCE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def _template(argv: list[str], drop: tuple[str, ...], extra: list[str]) -> str:
    """The command as given, less the options `drop` names (with their values), plus `extra`;
    braces in the given words stay as written (a template fills only trainroom's placeholders)."""
    kept: list[str] = []
    skip = False
    for w in argv:
        if skip:
            skip = False
            continue
        name = w.split("=", 1)[0]
        if name in drop:
            skip = "=" not in w
            continue
        kept.append(w)
    return shlex.join(kept) + " " + " ".join(extra)


def _option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `--name value` or `--name=value` among `names` (None: not given)."""
    found: str | None = None
    for i, w in enumerate(argv):
        name, eq, value = w.partition("=")
        if name in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def _count(
    argv: list[str], src: str, names: tuple[str, ...], field: str, default: int
) -> tuple[int | None, str]:
    """A whole-number setting: from the command, else the script's one literal `field=N`, else
    the default when neither names it and no config file could (None: set some other way)."""
    given = _option(argv, names)
    if given is not None:
        return (int(given), f"{names[0]} {given} in the command") if given.isdigit() else (None, "")
    literals = set(re.findall(rf"\b{field}\s*=\s*(\d+)\b", src))
    if len(literals) == 1:
        n = literals.pop()
        return int(n), f"{field}={n} in the script"
    configs = any(w.endswith((".json", ".yaml", ".yml")) or w.startswith("--config") for w in argv[1:])
    if field not in src and not configs:
        return default, f"{field} is not set: the default {default}"
    return None, ""


def _hf_hints(argv: list[str], src: str) -> LogHints:
    if "logging_strategy" in src or _option(argv, ("--logging_strategy",)) not in (None, "steps"):
        return LogHints()  # logged per epoch, or not at all: no spacing in steps
    n, why = _count(argv, src, ("--logging_steps",), "logging_steps", 500)
    return LogHints(logging_steps=n, evidence=why) if n else LogHints()


def _lightning_hints(argv: list[str], src: str) -> LogHints:
    if "GradientAccumulationScheduler" in src:
        return LogHints()  # the factor changes with the epoch
    names = ("--accumulate_grad_batches", "--trainer.accumulate_grad_batches", "--accumulate-grad-batches")
    n, why = _count(argv, src, names, "accumulate_grad_batches", 1)
    return LogHints(accumulate=n, evidence=why) if n else LogHints()


def recognise(argv: list[str], cwd: str) -> Recognised | None:
    script = script_of(argv)
    if script is None:
        return None
    src = _source(script, cwd)
    if src is None:
        return None
    if "HfArgumentParser" in src and "TrainingArguments" in src:
        return Recognised(
            framework="hf",
            script=script,
            evidence="parses TrainingArguments with HfArgumentParser",
            resume_template=_template(
                argv, ("--resume_from_checkpoint",), ["--resume_from_checkpoint {ckpt_dir}"]
            ),
            log_hints=_hf_hints(argv, src),
        )
    if "TrainingArguments" in src and re.search(r"^\s*(?:from|import) transformers", src, re.M):
        return Recognised(
            framework="hf",
            script=script,
            evidence="builds TrainingArguments in code",
            note=(
                "no template: the script's own arguments are not the Trainer's; pass --resume-template, "
                "or trainer.train(resume_from_checkpoint=os.environ.get('TRAINROOM_RESUME'))"
            ),
            log_hints=_hf_hints(argv, src),
        )
    if "init_from" in src and "configurator.py" in src:
        return Recognised(
            framework="nanogpt",
            script=script,
            evidence="nanoGPT's train.py (configurator.py, init_from)",
            resume_template=_template(
                argv, ("--init_from", "--out_dir"), ["--init_from=resume", "--out_dir={ckpt_dir}"]
            ),
        )
    if "LightningCLI" in src:
        if "fit" not in argv:
            return Recognised(
                framework="lightning",
                script=script,
                evidence="a LightningCLI script",
                note="no template: the command has no `fit` subcommand to take --ckpt_path",
                log_hints=_lightning_hints(argv, src),
            )
        return Recognised(
            framework="lightning",
            script=script,
            evidence="a LightningCLI script run with `fit`",
            resume_template=_template(argv, ("--ckpt_path",), ["--ckpt_path {ckpt}"]),
            log_hints=_lightning_hints(argv, src),
        )
    if re.search(
        r"^\s*(?:import lightning|from lightning|import pytorch_lightning|from pytorch_lightning)", src, re.M
    ):
        return Recognised(
            framework="lightning",
            script=script,
            evidence="imports lightning",
            note=(
                "no template: a Lightning script takes ckpt_path in code, e.g. "
                "trainer.fit(model, ckpt_path=os.environ.get('TRAINROOM_RESUME'))"
            ),
            log_hints=_lightning_hints(argv, src),
        )
    return None
