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

from trainroom.core import config as cfg

DEFAULT_LINGER_S = 3600.0
ENV_CKPT_ROOT = "TRAINROOM_CKPT_ROOT"
ENV_SYS_ROOT = "TRAINROOM_SYS_ROOT"
ENV_PROC_ROOT = "TRAINROOM_PROC_ROOT"

NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


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
    keep: NonNegativeInt | None = None
    lock_files: list[str] = []
    watch_ckpt: list[str] = []
    keep_verified_copies: bool = False
    disk_budget_bytes: PositiveInt | None = None
    # The demo's GPU scenarios on a machine without one: the keeper reads a fake NVML.
    fake_nvml: bool = False
    demo: bool = False


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
    log_pattern: str
    linger_s: float
    auto_resume: int
    auto_resume_delay_s: float | None
    auto_resume_policy: cfg.AutoResume
    resume_template: str | None
    lock_files: tuple[str, ...]
    host_processes: tuple[str, ...]
    fake_nvml: bool
    thresholds: cfg.Thresholds
    kill: cfg.Kill
    bench: cfg.Bench
    roots: HostRoots
    journal: cfg.JournalPolicy = msgspec.field(default_factory=cfg.JournalPolicy)
    # Why the project's trainroom.toml was not used (the keeper journals it as a warning).
    config_note: str | None = None

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
) -> RunSettings:
    """Merge the launch flags over the project's config (already `resolved(cwd)`: its relative
    paths made absolute) into the settings a keeper runs by."""
    lock_files = list(options.lock_files)
    lock_files += [f for f in config.lock_files if f not in lock_files]
    linger = options.linger_s if options.linger_s is not None else DEFAULT_LINGER_S
    return RunSettings(
        ckpt_root=str(checkpoint_root(options, config, cwd=cwd, run_dir=run_dir, env=env)),
        keep=options.keep if options.keep is not None else config.checkpoints.keep,
        disk_budget_bytes=options.disk_budget_bytes,
        watch_globs=tuple(options.watch_ckpt or config.checkpoints.watch),
        keep_verified_copies=options.keep_verified_copies,
        log_pattern=options.log_pattern or config.log.pattern,
        linger_s=linger if math.isfinite(linger) else DEFAULT_LINGER_S,
        auto_resume=options.auto_resume if options.auto_resume is not None else config.auto_resume.max,
        auto_resume_delay_s=options.auto_resume_delay_s,
        auto_resume_policy=config.auto_resume,
        resume_template=options.resume_template or config.resume.command,
        lock_files=tuple(lock_files),
        host_processes=tuple(config.host_processes),
        fake_nvml=options.fake_nvml,
        thresholds=config.thresholds,
        kill=config.kill,
        bench=config.bench,
        journal=config.journal,
        roots=HostRoots(
            proc=env.get(ENV_PROC_ROOT, "/proc"),
            cgroup=env.get(ENV_SYS_ROOT, "/sys/fs/cgroup"),
        ),
        config_note=config_note,
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
