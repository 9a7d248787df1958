"""`trainroom launch [OPTIONS] -- CMD ...`: start a trainer detached under a keeper."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

import msgspec

from trainroom.core.cli.errors import CliError
from trainroom.core.configuration import argtypes
from trainroom.core.configuration.config import check_template
from trainroom.core.configuration.sections import ConfigError, check_command, check_url
from trainroom.core.configuration.settings import JobOptions, LaunchOptions, NotifyOptions, job_options
from trainroom.core.run.launch import launch
from trainroom.core.run.launch import launch_options as launch_options_from

MAX_LINGER_S = 30 * 86400.0


def launch_options(args: argparse.Namespace, argv: list[str] | None = None) -> LaunchOptions:
    opts: dict[str, Any] = {}
    job = job_of(args, argv or [])
    if job is not None:
        opts["job"] = job
    if getattr(args, "eval_command", None):
        try:
            check_template("--eval-command", args.eval_command, "the command line")
        except ConfigError as exc:
            raise CliError(str(exc).removeprefix("the command line: ")) from None
    for key in (
        "ckpt_root",
        "log_pattern",
        "linger_s",
        "auto_resume",
        "resume_template",
        "keep",
        "eval_command",
    ):
        val = getattr(args, key, None)
        if val is not None:
            opts[key] = os.path.abspath(val) if key == "ckpt_root" else val
    if getattr(args, "lock_file", None):
        opts["lock_files"] = [os.path.abspath(x) for x in args.lock_file]
    if getattr(args, "watch_ckpt", None):
        opts["watch_ckpt"] = list(args.watch_ckpt)
    if getattr(args, "keep_verified_copies", False):
        opts["keep_verified_copies"] = True
    if getattr(args, "disk_budget", None):
        opts["disk_budget_bytes"] = args.disk_budget
    if getattr(args, "foreground", False):
        opts |= foreground_options(args, opts.get("job"))
    notify = notify_options(args)
    if notify != NotifyOptions():
        opts["notify"] = notify
    return launch_options_from(opts)


def foreground_options(args: argparse.Namespace, job: JobOptions | None) -> dict[str, Any]:
    """What a foreground launch adds: the Slurm task, no linger, the checkpoint signal, and in a
    requeued Slurm job (SLURM_RESTART_COUNT > 0) the verified checkpoint its next attempt resumes from."""
    opts: dict[str, Any] = {"linger_s": getattr(args, "linger_s", None)}
    from trainroom.core.slurm.place import place_of

    opts["foreground"] = True
    place = place_of(os.environ)
    if place is not None:
        opts["slurm"] = place
    if opts.get("linger_s") is None:
        opts["linger_s"] = 0.0  # the keeper ends with the trainer (the step must end then)
    if getattr(args, "checkpoint_signal", None):
        opts["checkpoint_signal"] = args.checkpoint_signal
    from trainroom.core.cli.foreground import ENV_RESUME_JOB, previous_verified

    earlier = os.environ.get(ENV_RESUME_JOB) or (
        job.name if place is not None and place.restart_count > 0 and job is not None else None
    )
    if earlier:
        found = previous_verified(earlier)
        if found is not None:
            opts["resume_from"], opts["resume_step"] = found
    return opts


def job_of(args: argparse.Namespace, argv: list[str]) -> JobOptions | None:
    """`--job NAME`, else the Slurm job (`slurm-<JOBID>`), else torchrun's rendezvous id in the
    command, else TORCHELASTIC_RUN_ID. In a Slurm job the node is SLURMD_NODENAME and the node rank,
    where torchrun gives none, the task's SLURM_PROCID (a keeper per task)."""
    from trainroom.core.slurm.place import place_of

    place = place_of(os.environ)
    name = getattr(args, "job", None)
    try:
        if place is None:
            return job_options(name, argv, os.environ, socket.gethostname())
        job = job_options(name or place.job_name, argv, os.environ, place.node or socket.gethostname())
        if job is None:
            return None
        return msgspec.structs.replace(
            job,
            source=job.source if name else "SLURM_JOB_ID",
            node_rank=job.node_rank if job.node_rank is not None else place.procid,
            nnodes=job.nnodes or str(place.ntasks),
        )
    except msgspec.ValidationError:
        given = "--job" if getattr(args, "job", None) else "the job name (torchrun's --rdzv-id)"
        raise CliError(
            f"{given}: expected letters, digits, '.', '_' and '-' (at most 128 characters)"
        ) from None


def notify_options(args: argparse.Namespace) -> NotifyOptions:
    """The --notify-* flags, each target checked here (a bad one is exit 2, and is never echoed:
    a URL may hold a secret)."""
    targets: dict[str, list[str]] = {}
    for key in ("webhook", "slack", "ntfy"):
        urls = list(getattr(args, f"notify_{key}", None) or [])
        for url in urls:
            why = check_url(url)
            if why:
                raise CliError(f"--notify-{key}: {why}")
        targets[key] = urls
    commands = list(getattr(args, "notify_command", None) or [])
    for command in commands:
        why = check_command(command)
        if why:
            raise CliError(f"--notify-command: {why}")
    return NotifyOptions(
        **targets,
        command=commands,
        desktop=bool(getattr(args, "notify_desktop", False)),
        min_severity=getattr(args, "notify_min_severity", None),
    )


def add_launch_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--job",
        metavar="NAME",
        help="this run is one node of job NAME (`trainroom job`); default: torchrun's --rdzv-id",
    )
    sp.add_argument("--ckpt-root", dest="ckpt_root", help="checkpoint root (default: <run dir>/checkpoints)")
    sp.add_argument(
        "--log-pattern",
        dest="log_pattern",
        type=argtypes.log_pattern,
        help="regex with named groups step, loss, lr, grad_norm for log-line telemetry (no step "
        "group: each match is a step); default: the built-in recognisers (HF Trainer, Lightning, nanoGPT)",
    )
    sp.add_argument(
        "--linger",
        dest="linger_s",
        type=argtypes.seconds(0, MAX_LINGER_S),
        help="seconds the keeper stays after the trainer ends with no viewer attached (default 60; "
        "3600 after a death, for its resume; trainroom.toml [keeper])",
    )
    sp.add_argument(
        "--auto-resume",
        dest="auto_resume",
        type=argtypes.count(0, 100),
        metavar="N",
        help="resume by itself at most N times when the death criteria hold",
    )
    sp.add_argument(
        "--resume-template",
        dest="resume_template",
        help="the command for a resume; {ckpt}, {ckpt_dir}, {step}, {run_id} are replaced "
        "(default: trainroom.toml's, else the one a recognised HF, nanoGPT or LightningCLI script fits)",
    )
    sp.add_argument(
        "--eval-command",
        dest="eval_command",
        metavar="TEMPLATE",
        help="the trainer's own evaluation, run on each verified checkpoint ({ckpt} filled in) before "
        "it is promoted; one that regresses is held back (default: trainroom.toml's [eval])",
    )
    sp.add_argument("--lock-file", dest="lock_file", action="append", help="a lock file the trainer holds")
    sp.add_argument(
        "--watch-ckpt",
        dest="watch_ckpt",
        action="append",
        metavar="GLOB",
        help="checkpoint files an uninstrumented trainer writes (verified once stable)",
    )
    sp.add_argument(
        "--keep-verified-copies",
        action="store_true",
        help="keep a verified copy of each watched checkpoint version",
    )
    sp.add_argument(
        "--keep", type=argtypes.count(0, 1_000_000), help="verified checkpoints prune keeps (default 2)"
    )
    sp.add_argument(
        "--disk-budget",
        dest="disk_budget",
        type=argtypes.size,
        help="bytes the checkpoint root may use, e.g. 50G",
    )
    add_notify_options(sp)


def add_notify_options(sp: argparse.ArgumentParser) -> None:
    """Alert channels for this run, added to trainroom.toml's [notify] (README: Alerts and metrics)."""
    g = sp.add_argument_group("alerts (added to trainroom.toml's [notify])")
    g.add_argument("--notify-webhook", action="append", metavar="URL", help="POST each alert as JSON")
    g.add_argument(
        "--notify-slack", action="append", metavar="URL", help="a Slack-compatible incoming webhook"
    )
    g.add_argument(
        "--notify-ntfy", action="append", metavar="URL", help="an ntfy topic URL (ntfy.sh or your own)"
    )
    g.add_argument(
        "--notify-command",
        action="append",
        metavar="CMD",
        help="run CMD per alert: TRAINROOM_ALERT_* variables, JSON on stdin",
    )
    g.add_argument("--notify-desktop", action="store_true", help="notify-send, where a session bus exists")
    g.add_argument(
        "--notify-min-severity",
        choices=("info", "warning", "critical"),
        help="findings at or above this are alerted (default: warning)",
    )


def _signal_name(text: str) -> str:
    import signal

    word = text.upper().removeprefix("SIG")
    names = {s.name.removeprefix("SIG") for s in signal.Signals}
    if word not in names or word in ("KILL", "STOP", "TERM", "INT"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a signal that can ask for a checkpoint (e.g. USR2)"
        )
    return word


def add_foreground_options(sp: argparse.ArgumentParser) -> None:
    way = sp.add_mutually_exclusive_group()
    way.add_argument(
        "--foreground",
        action="store_true",
        default=None,
        help="stay for the run's life and exit with the trainer's status (128+N for signal N); "
        "SIGTERM stops the trainer through the kill plan. The default inside a Slurm step (srun)",
    )
    sp.add_argument(
        "--checkpoint-signal",
        dest="checkpoint_signal",
        type=_signal_name,
        metavar="SIG",
        help="in the foreground: this signal asks the trainer to checkpoint now (sdk.checkpoint_requested); "
        "in a Slurm job the verified checkpoint is then requeued from (default USR2, as --signal=B:USR2@N)",
    )
    way.add_argument(
        "--detach",
        dest="foreground",
        action="store_false",
        help="return at once, even inside a Slurm step (the step then ends: Slurm may kill the run)",
    )


def cmd_launch(args: argparse.Namespace) -> int:
    from trainroom.core.slurm.place import in_step, place_of

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if getattr(args, "foreground", None) is None:
        args.foreground = in_step(os.environ)
    opts = launch_options(args, argv)
    if not args.foreground:
        info = launch(argv, opts)
        print(info.run_id)
        return 0
    from trainroom.core.cli.foreground import run_foreground
    from trainroom.core.slurm.place import rank_env

    env = dict(os.environ)
    place = place_of(env)
    if place is not None:
        env.update(rank_env(place, env, argv))
    return run_foreground(argv, opts, env)
