"""A run's settings: what `launch` was told (LaunchOptions, recorded as given) merged with the
project's `trainroom.toml` (config.Config) into one frozen RunSettings, resolved once when the
keeper starts. Every part of the keeper reads RunSettings; none merges options and config itself.

Precedence, field by field: the launch flag, then trainroom.toml, then the built-in default (for
the checkpoint root: `--ckpt-root`, `[checkpoints] root`, TRAINROOM_CKPT_ROOT as the launching
shell had it, then `<run dir>/checkpoints`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import msgspec

from trainroom.core.configuration import config as cfg
from trainroom.core.configuration import sections
from trainroom.core.logs.frameworks import Recognised, recognise
from trainroom.core.logs.loglines import LogHints
from trainroom.core.slurm.place import SlurmPlace
from trainroom.core.units import redact_command, redact_url

DEFAULT_LINGER_S = 60.0
ENV_CKPT_ROOT = "TRAINROOM_CKPT_ROOT"
ENV_SYS_ROOT = "TRAINROOM_SYS_ROOT"
ENV_PROC_ROOT = "TRAINROOM_PROC_ROOT"

NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class NotifyOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """`launch --notify-*`: alert channels added to trainroom.toml's [notify], and its threshold.
    The targets are secrets: RunState carries `redacted()` copies only."""

    webhook: list[str] = []
    slack: list[str] = []
    ntfy: list[str] = []
    command: list[str] = []
    desktop: bool = False
    min_severity: sections.AlertSeverity | None = None

    def redacted(self) -> NotifyOptions:
        return msgspec.structs.replace(
            self,
            webhook=[redact_url(u) for u in self.webhook],
            slack=[redact_url(u) for u in self.slack],
            ntfy=[redact_url(u) for u in self.ntfy],
            command=[redact_command(c) for c in self.command],
        )


# torchrun's --rdzv-id when none is given: it names no job.
TORCHRUN_DEFAULT_ID = "none"
JobName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")]


class JobOptions(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """The run as one node of a multi-node job (`launch --job`, or torchrun's rendezvous id):
    what `trainroom job` merges the nodes' keepers by."""

    name: JobName
    source: str  # where the name came from: --job, --rdzv-id, TORCHELASTIC_RUN_ID
    host: str  # this node's host name, as the launching machine said it
    node_rank: NonNegativeInt | None = None  # torchrun's --node-rank (None: not given, as with c10d)
    nnodes: str | None = None  # torchrun's --nnodes as given ("2", or "1:4" when elastic)


def _flag(argv: list[str], *names: str) -> str | None:
    """The value of the last `--name V` or `--name=V` in argv (torchrun spells its flags both
    with dashes and with underscores)."""
    found: str | None = None
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif word.startswith(name + "="):
                found = word[len(name) + 1 :]
    return found


def torchrun_args(argv: list[str]) -> list[str]:
    """torchrun's own arguments in a command: those before the training script (a `.py` word or
    `-m MODULE`), when the command is torchrun (the script, `python -m torch.distributed.run`)."""
    head = [os.path.basename(a) for a in argv[:4]]
    launcher = "torchrun" in head or any(
        a in ("torch.distributed.run", "torch.distributed.launch") for a in argv[:4]
    )
    if not launcher:
        return []
    start = next(
        (i for i, a in enumerate(argv) if "torch.distributed." in a or os.path.basename(a) == "torchrun"), 0
    )
    out: list[str] = []
    for word in argv[start + 1 :]:
        if word == "-m" or word.endswith(".py") or word == "--":
            break
        out.append(word)
    return out


def job_options(name: str | None, argv: list[str], env: Mapping[str, str], host: str) -> JobOptions | None:
    """The job this run is a node of: `--job NAME`, else torchrun's `--rdzv-id` (or
    `--rdzv_id`), else TORCHELASTIC_RUN_ID; None when nothing names one. The node rank and node
    count come from torchrun's flags when the command is torchrun."""
    targs = torchrun_args(argv)
    source = "--job"
    if name is None:
        name, source = _flag(targs, "--rdzv-id", "--rdzv_id"), "--rdzv-id"
    if name is None or name == TORCHRUN_DEFAULT_ID:
        name, source = env.get("TORCHELASTIC_RUN_ID") or None, "TORCHELASTIC_RUN_ID"
    if name is None or name == TORCHRUN_DEFAULT_ID:
        return None
    rank_text = _flag(targs, "--node-rank", "--node_rank")
    node_rank = int(rank_text) if rank_text is not None and rank_text.isdigit() else None
    nnodes = _flag(targs, "--nnodes")
    return msgspec.convert(
        {"name": name, "source": source, "host": host, "node_rank": node_rank, "nnodes": nnodes},
        JobOptions,
    )


class LaunchOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The flags `launch` (or `demo`) was given, as given: the run record keeps them so a later
    reader knows what was asked. Unset is None (or empty): the config or the default decides."""

    ckpt_root: str | None = None
    log_pattern: str | None = None
    linger_s: NonNegativeFloat | None = None
    auto_resume: NonNegativeInt | None = None
    # The wait before an automatic resume, overriding [auto_resume] backoff (tests, the demo).
    auto_resume_delay_s: NonNegativeFloat | None = None
    resume_template: str | None = None
    # The evaluation that gates promotion ({ckpt} filled in), overriding trainroom.toml's [eval].
    eval_command: str | None = None
    keep: NonNegativeInt | None = None
    lock_files: list[str] = []
    watch_ckpt: list[str] = []
    keep_verified_copies: bool = False
    disk_budget_bytes: PositiveInt | None = None
    # The demo's GPU scenarios on a machine without one: the keeper reads a fake NVML.
    fake_nvml: bool = False
    demo: bool = False
    notify: NotifyOptions = msgspec.field(default_factory=NotifyOptions)
    job: JobOptions | None = None
    # `launch --foreground`, or inside a Slurm step: the keeper stops the trainer on SIGTERM through
    # its kill plan and exits when the trainer has ended; `launch` waits and exits with its status.
    foreground: bool = False
    slurm: SlurmPlace | None = None  # the Slurm task this run is (core/slurm/place.py)
    # The signal that asks for a checkpoint before a time limit or preemption (--signal=B:USR2@N).
    checkpoint_signal: str | None = None
    # The first attempt resumes from this verified checkpoint (a requeued Slurm job's next attempt).
    resume_from: str | None = None
    resume_step: NonNegativeInt | None = None
    # A requeued Slurm job's task took up its run (cli/requeue.py): the next keeper starts the
    # run's next attempt (keeper/requeue.py) and clears this, so it is done once.
    requeue_pending: bool = False

    def shown(self) -> LaunchOptions:
        """These options as every reader may see them (the run's state, snapshots): secrets redacted."""
        return msgspec.structs.replace(self, notify=self.notify.redacted())


class HostRoots(msgspec.Struct, kw_only=True, frozen=True):
    """Where reclaim and the mounts table (DRVFS_CHECKPOINTS) read the host: the real /proc and
    /sys/fs/cgroup, or a prepared tree that mimics them (TRAINROOM_PROC_ROOT / TRAINROOM_SYS_ROOT,
    for tests: this machine's cgroups are v1 and a real drop empties the whole page cache)."""

    proc: str = "/proc"
    cgroup: str = "/sys/fs/cgroup"


class RunSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Everything a keeper decides by, resolved once (see `resolve`)."""

    ckpt_root: str
    keep: int
    disk_budget_bytes: int | None
    watch_globs: tuple[str, ...]
    keep_verified_copies: bool
    # The run's own log pattern; None: the built-in recognisers (core/logs/logformats).
    log_pattern: str | None
    linger_s: float
    # The linger of a run whose trainer died (DEAD): its resume is the next step, often later.
    dead_linger_s: float
    max_dead_lingerers: int  # keepers of dead runs lingering at once (keeper.lingering)
    # Seconds between the probes of a resting keeper (keeper.rest).
    rest_probe_s: float
    auto_resume: int
    auto_resume_delay_s: float | None
    auto_resume_policy: cfg.AutoResume
    resume_template: str | None
    # Where the template came from: "--resume-template", "trainroom.toml", or "recognised: ..."
    # (core/logs/frameworks, from the command's script); None without a template.
    resume_template_from: str | None
    lock_files: tuple[str, ...]
    host_processes: tuple[str, ...]
    fake_nvml: bool
    thresholds: cfg.Thresholds
    kill: cfg.Kill
    bench: cfg.Bench
    roots: HostRoots
    # The trainer's own evaluation gating promotion (command None: not gated).
    eval: cfg.Eval = msgspec.field(default_factory=cfg.Eval)
    journal: sections.JournalPolicy = msgspec.field(default_factory=sections.JournalPolicy)
    # A Slurm job's checkpoint before its time limit (core/slurm/timeleft.py).
    slurm: cfg.Slurm = msgspec.field(default_factory=cfg.Slurm)
    # Why the project's trainroom.toml was not used (the keeper journals it as a warning).
    config_note: str | None = None
    # The alert channels: trainroom.toml's [notify] with the launch flags' targets added.
    notify: sections.Notify = msgspec.field(default_factory=sections.Notify)
    # The framework the command's script is built on (core/logs/frameworks), when recognised.
    recognised: Recognised | None = None

    @property
    def log_hints(self) -> LogHints | None:
        """How the trainer's log counts steps, where its command or script says (frameworks)."""
        return self.recognised.log_hints if self.recognised is not None else None

    def auto_resume_delay(self, n: int) -> float:
        """The wait before automatic resume number n (1-based)."""
        if self.auto_resume_delay_s is not None:
            return self.auto_resume_delay_s
        return self.auto_resume_policy.delay_s(n)


def resolve(
    options: LaunchOptions,
    config: cfg.Config,
    *,
    cwd: str,
    run_dir: str | os.PathLike[str],
    env: Mapping[str, str],
    config_note: str | None = None,
    argv: list[str] | None = None,
) -> RunSettings:
    """Merge the launch flags over the project's config (already `resolved(cwd)`: its relative
    paths made absolute) into the settings a keeper runs by. `argv`: the trainer's command, whose
    script may offer a resume template (core/logs/frameworks) when neither names one."""
    lock_files = list(options.lock_files)
    lock_files += [f for f in config.lock_files if f not in lock_files]
    linger = options.linger_s if options.linger_s is not None else config.keeper.linger_s
    dead_linger = options.linger_s if options.linger_s is not None else config.keeper.dead_linger_s
    recognised = recognise(list(argv), cwd) if argv else None
    template, template_from = resume_template(options, config, recognised)
    return RunSettings(
        ckpt_root=str(checkpoint_root(options, config, cwd=cwd, run_dir=run_dir, env=env)),
        keep=options.keep if options.keep is not None else config.checkpoints.keep,
        disk_budget_bytes=options.disk_budget_bytes,
        watch_globs=tuple(options.watch_ckpt or config.checkpoints.watch),
        keep_verified_copies=options.keep_verified_copies,
        log_pattern=options.log_pattern or config.log.pattern,
        linger_s=linger if math.isfinite(linger) else DEFAULT_LINGER_S,
        dead_linger_s=dead_linger if math.isfinite(dead_linger) else DEFAULT_LINGER_S,
        max_dead_lingerers=config.keeper.max_dead_lingerers,
        rest_probe_s=config.keeper.rest_probe_s,
        auto_resume=options.auto_resume if options.auto_resume is not None else config.auto_resume.max,
        auto_resume_delay_s=options.auto_resume_delay_s,
        auto_resume_policy=config.auto_resume,
        resume_template=template,
        resume_template_from=template_from,
        lock_files=tuple(lock_files),
        host_processes=tuple(config.host_processes),
        fake_nvml=options.fake_nvml,
        thresholds=config.thresholds,
        kill=config.kill,
        bench=config.bench,
        eval=eval_policy(options, config),
        journal=config.journal,
        slurm=config.slurm,
        roots=HostRoots(
            proc=env.get(ENV_PROC_ROOT, "/proc"),
            cgroup=env.get(ENV_SYS_ROOT, "/sys/fs/cgroup"),
        ),
        config_note=config_note,
        notify=notify_settings(options.notify, config.notify),
        recognised=recognised,
    )


def eval_policy(options: LaunchOptions, config: cfg.Config) -> cfg.Eval:
    """The evaluation a run's promotion is gated by: `--eval-command` over trainroom.toml's [eval]
    (the keeper gates by it; `trainroom eval` re-runs it)."""
    if options.eval_command:
        return msgspec.structs.replace(config.eval, command=options.eval_command)
    return config.eval


def resume_template(
    options: LaunchOptions, config: cfg.Config, recognised: Recognised | None
) -> tuple[str | None, str | None]:
    """The resume template and where it came from: the flag, then trainroom.toml, then the one
    the recognised framework offers."""
    if options.resume_template:
        return options.resume_template, "--resume-template"
    if config.resume.command:
        return config.resume.command, "trainroom.toml"
    if recognised is not None and recognised.resume_template:
        return recognised.resume_template, f"recognised: {recognised.evidence} ({recognised.script})"
    return None, None


def notify_settings(options: NotifyOptions, config: sections.Notify) -> sections.Notify:
    """trainroom.toml's [notify] with the flags' targets added (each once) and their threshold
    over the file's."""

    def merged(from_config: sections.Targets, from_flags: list[str]) -> list[str]:
        out = sections.as_list(from_config)
        return out + [t for t in from_flags if t not in out]

    return msgspec.structs.replace(
        config,
        webhook=merged(config.webhook, options.webhook),
        slack=merged(config.slack, options.slack),
        ntfy=merged(config.ntfy, options.ntfy),
        command=merged(config.command, options.command),
        desktop=config.desktop or options.desktop,
        min_severity=options.min_severity or config.min_severity,
    )


def checkpoint_root(
    options: LaunchOptions,
    config: cfg.Config,
    *,
    cwd: str,
    run_dir: str | os.PathLike[str],
    env: Mapping[str, str],
) -> Path:
    if options.ckpt_root:
        return Path(options.ckpt_root)
    root = config.checkpoints.root
    if root:
        return Path(root) if os.path.isabs(root) else Path(cwd) / root
    from_env = env.get(ENV_CKPT_ROOT)
    if from_env:
        return Path(from_env).expanduser().absolute()
    return Path(run_dir) / "checkpoints"
