"""`trainroom.toml`: the run's thresholds, checkpoint policy, recovery settings and theme.

Looked up in the project dir (the trainer's cwd) first, then in the state dir (`TRAINROOM_HOME`,
default `~/.local/state/trainroom`); the first file found wins whole (no merging, so what a run
uses is what one file says). Decoded by msgspec into typed Structs that forbid unknown keys, so a
typo is an error naming the key, the file and the expected type instead of a silently ignored
setting. Every field has a default: no file at all is a valid configuration.

Example::

    theme = "trainroom-light"
    lock_files = ["out/train.lock"]

    [checkpoints]
    root = "out"
    keep = 2
    watch = ["out/ckpt*.pt"]

    [thresholds]
    stall_floor_s = 10.0

    [kill]
    grace_s = 10.0

    [resume]
    command = "python train.py --init_from=resume --out_dir={ckpt_dir}"

    [auto_resume]
    max = 3

    [eval]
    command = "python eval.py --ckpt {ckpt}"
    margin = 0.05

    [log]
    pattern = 'iter (?P<step>\\d+): loss (?P<loss>\\S+?),'

    [notify]
    min_severity = "warning"
    webhook = "https://example.org/hooks/trainroom"
    ntfy = ["https://ntfy.sh/my-secret-topic"]

    [hosts.node1]
    target = "ssh://me@10.0.0.5:2222"

    [keys]
    kill = "ctrl+k"
    zoom = "z,f11"

    [journal]
    snapshot_records = 5000
    full_resolution_h = 24

    [slurm]
    margin_s = 60.0
    checkpoint_time_s = 60.0
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Annotated, Any

import msgspec

from trainroom.core.configuration.sections import (
    ConfigError,
    Host,
    JournalPolicy,
    Keys,
    Notify,
    check_hosts,
    check_keys,
    check_notify,
)
from trainroom.core.logs.logformats import NANOGPT_PATTERN
from trainroom.core.units import GIB, MIB

CONFIG_NAME = "trainroom.toml"

# Every number is finite and in range: TOML can say nan and inf, and neither is a setting (an upper
# bound makes msgspec refuse both, with the key in its message).
FINITE = 1e12
NonNegative = Annotated[float, msgspec.Meta(ge=0, le=FINITE)]
Positive = Annotated[float, msgspec.Meta(gt=0, le=FINITE)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
AtLeastOne = Annotated[float, msgspec.Meta(ge=1, le=FINITE)]
Count = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]

# nanoGPT's training line: `iter 100: loss 2.3456, time 123.45ms, mfu 12.34%` (one of the built-in
# log recognisers, core/logs/logformats).
DEFAULT_LOG_PATTERN = NANOGPT_PATTERN
# Placeholders a resume command template may use. Only these are filled; every other brace is
# kept as written (`python -c "print({})"`, JSON such as `--opts '{"a": {"b": 1}}'`).
RESUME_PLACEHOLDERS = ("ckpt", "ckpt_dir", "step", "run_id")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(RESUME_PLACEHOLDERS) + r")\}")
# What looks like a placeholder (`{name}`): an unknown one is a typo, refused.
_NAMED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill_template(word: str, values: dict[str, str]) -> str:
    """`word` with each known placeholder replaced by its value (one pass: a value's own braces
    stay as they are); any other brace is literal."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], word)


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A table of trainroom.toml (as sections.Section): an unknown key is an error that names it."""


class Checkpoints(_Section):
    # Where the trainer writes checkpoints, relative to the project dir; None: only what the
    # reporter announces and what `watch` matches.
    root: str | None = None
    # How many verified checkpoints prune keeps (the newest, and one to fall back on).
    keep: Count = 2
    # Globs, relative to the project dir, that an uninstrumented trainer's checkpoints match.
    watch: list[str] = []


# Phases that are not a stall for as long as their bound (a Phase message's own bound wins).
DEFAULT_PHASE_BOUNDS_S: dict[str, float] = {
    "checkpoint-save": 900.0,
    "checkpoint-load": 900.0,
    "eval": 1800.0,
    "data": 600.0,
}


class Thresholds(_Section):
    """Every number a rule judges by, once: the watchdog, the sanity rules and the disk guard take
    this Struct (the keeper journals it in KeeperStarted, so a reader computes the same bounds)."""

    # ---- STALLED / HUNG: no step (nor heartbeat) for max(stall_floor_s, stall_factor x median
    # step interval); the median needs min_intervals intervals, before that start_grace_s bounds
    # the wait for the first step (or the end of a phase).
    stall_floor_s: NonNegative = 10.0
    stall_factor: AtLeastOne = 3.0
    min_intervals: Count = 2
    start_grace_s: NonNegative = 120.0
    # Phases that are not a stall for this long (checkpoint-save, checkpoint-load, eval, data).
    phase_bounds_s: dict[str, NonNegative] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_PHASE_BOUNDS_S)
    )
    # A pid in D (uninterruptible I/O) this long is a hang; None: the progress bound.
    d_state_bound_s: NonNegative | None = None
    # How late the heartbeat's frame sampler and the activity probe may see a park begin (one
    # heartbeat plus one probe cycle, with margin): a main thread on one line and not running
    # since within this of its last step has been parked for the whole step gap.
    park_slack_s: NonNegative = 3.0
    # ---- SLOW: slow_steps consecutive steps each over slow_factor x the median step interval of
    # at least slow_baseline_min intervals before them.
    slow_factor: AtLeastOne = 3.0
    slow_steps: Count = 5
    slow_baseline_min: Count = 10
    # ---- GHOST_MEMORY: driver-attributed VRAM over ghost_factor x what the allocator reserves, for
    # ghost_cycles probe cycles, and by at least ghost_min_excess_gib (a CUDA context alone costs a
    # few hundred MiB the allocator never sees).
    ghost_factor: AtLeastOne = 1.5
    ghost_cycles: Count = 2
    ghost_min_excess_gib: NonNegative = 1.0
    # ---- ORPHAN_CONTEXT: a device this busy with no live compute process of ours, or a driver pid
    # that is gone, for orphan_cycles probe cycles.
    orphan_util_percent: Percent = 90.0
    orphan_cycles: Count = 2
    # ---- HOST_RAM_LOW: MemAvailable under this (scenario 13: torch.load fails under 3 GB free).
    host_ram_low_gib: NonNegative = 3.0
    # ---- REPEAT_DEATH: two attempts that die within this many steps of each other.
    repeat_death_window_steps: Count = 50
    # ---- DISK_HIGH at disk_warn, critical at disk_critical (scenario 11: a disk filled to 94%
    # overnight); DISK_FULL_SOON when the projection says full within disk_full_soon_s, critical
    # within disk_full_critical_s.
    disk_warn: Fraction = 0.85
    disk_critical: Fraction = 0.94
    disk_full_soon_s: NonNegative = 12 * 3600.0
    disk_full_critical_s: NonNegative = 3600.0
    # ---- LR_MISMATCH: requested/effective over lr_too_low_ratio (warm-up and decay legitimately
    # run below the requested LR, so this bound is wide), or effective/requested over
    # lr_too_high_ratio (nothing legitimate runs far above it). A fresh start whose first step
    # index is at most fresh_start_max_step began from scratch: a low LR still rising there is an
    # undeclared warm-up, so the check waits until it stops rising.
    lr_too_low_ratio: AtLeastOne = 50.0
    lr_too_high_ratio: AtLeastOne = 2.0
    # ---- LR_RUNAWAY: later in an attempt whose first step was in band, the effective LR above
    # lr_runaway_ratio x the requested one. 10x, an order of magnitude: an LR range test's loss
    # blows up within about 10x of a tuned LR (Smith 2017, "Cyclical Learning Rates"), and the
    # demo's diverge fault spikes its loss near 30x; a schedule never climbs above its base.
    lr_runaway_ratio: AtLeastOne = 10.0
    fresh_start_max_step: NonNegativeInt = 10
    # ---- EXPLODED_START: the first loss of an attempt over this factor x ln V (scenario 5: 96 vs 10.83).
    exploded_start_factor: AtLeastOne = 2.0
    # ---- WHITE_MODEL: |loss - ln V| <= white_band x ln V for white_steps steps and at least
    # white_min_observations reports (relative, because a bf16 loss near 10.8 moves in 0.0625 steps).
    white_band: Fraction = 0.02
    white_steps: Count = 50
    white_min_observations: Count = 3
    # Window sizes below count observations (one per reported step), not steps, so a trainer that
    # logs every 10th step still fills them. Baselines are re-sorted every refresh_every of them.
    refresh_every: Count = 8
    # ---- LOSS_SPIKE: loss above the median of the latest spike_baseline_window observations by
    # max(spike_sigmas x sigma, spike_min_rel x median, spike_min_nats), sigma from successive
    # differences over loss_window (at least min_window). One past the band is a candidate; a spike
    # once confirm_steps in a row are past it, or at once past spike_immediate x the band.
    loss_window: Count = 100
    min_window: Count = 20
    spike_baseline_window: Count = 20
    spike_sigmas: Positive = 6.0
    spike_min_rel: NonNegative = 0.10
    spike_min_nats: NonNegative = 0.05
    confirm_steps: Count = 2
    spike_immediate: AtLeastOne = 2.0
    # ---- DIVERGENCE: divergence_chunks consecutive medians of divergence_chunk observations above
    # the attempt's best chunk median by max(divergence_rel x best, divergence_min_nats).
    divergence_chunk: Count = 10
    divergence_chunks: Count = 4
    divergence_rel: NonNegative = 0.10
    divergence_min_nats: NonNegative = 0.05
    # ... and by divergence_noise_se standard errors of a window's median (the loss's own noise, from
    # the successive differences of the records: a noisy loss, or one seen at sampled steps, sets a
    # best chunk median low by chance, and that chance is not a rise).
    divergence_noise_se: NonNegative = 4.0
    # ---- GRAD_EXPLOSION: grad norm above max(grad_ratio x median, median + grad_sigmas x sigma)
    # over grad_window observations, or above grad_abs_max; grad_immediate x the band at once.
    grad_window: Count = 100
    grad_sigmas: Positive = 6.0
    grad_ratio: AtLeastOne = 10.0
    grad_abs_max: Positive = 1e8
    grad_immediate: AtLeastOne = 10.0
    # ---- RANK_OUTLIER: a rank against the median of the others by max(rank_sigmas x sigma,
    # rel x reference, floor); its loss is the median of its last rank_loss_window (its latest
    # alone counts at rank_immediate x the band); its step time needs rank_time_min_samples of the
    # last rank_time_window intervals.
    rank_sigmas: Positive = 5.0
    rank_loss_rel: NonNegative = 0.25
    rank_loss_min_nats: NonNegative = 0.5
    rank_loss_window: Count = 3
    rank_immediate: AtLeastOne = 2.0
    rank_time_rel: NonNegative = 1.0
    rank_time_min_s: NonNegative = 0.1
    rank_time_window: Count = 16
    rank_time_min_samples: Count = 4
    # ---- LOSS_SCALE: a scale below this has collapsed (every scale overflows): a warning.
    loss_scale_floor: NonNegative = 1.0
    # How long a recovered event (spike, explosion, non-finite, halving) stays listed.
    hold_s: NonNegative = 120.0

    @property
    def host_ram_low_bytes(self) -> int:
        return int(self.host_ram_low_gib * GIB)

    @property
    def ghost_min_excess_bytes(self) -> int:
        return int(self.ghost_min_excess_gib * GIB)


class Kill(_Section):
    # SIGTERM, this long for the group to exit cleanly, then SIGKILL.
    grace_s: NonNegative = 10.0
    # After the group is gone, wait (polling) until the run's driver-attributed VRAM is under
    # the tolerance: NVRx waits up to 50 s, every 2 s, for < 512 MB before a restart.
    vram_tolerance_mib: NonNegative = 512.0
    vram_timeout_s: NonNegative = 50.0
    vram_poll_s: Positive = 2.0

    @property
    def vram_tolerance_bytes(self) -> int:
        return int(self.vram_tolerance_mib * MIB)


class Resume(_Section):
    # The command of a resumed attempt, e.g. nanoGPT's
    # "python train.py --init_from=resume --out_dir={ckpt_dir}"; placeholders: {ckpt} (the
    # checkpoint path), {ckpt_dir}, {step}, {run_id}. None: the original argv again, with the
    # checkpoint in TRAINROOM_RESUME.
    command: str | None = None


class Eval(_Section):
    # The trainer's own evaluation, run on each verified candidate before it is promoted, e.g.
    # "python eval.py --ckpt {ckpt}"; placeholders as [resume]'s. None: promotion is not gated.
    command: str | None = None
    # A regex whose group `loss` (else its first group) is the figure, searched line by line; None:
    # the evaluation's own loss (`eval_loss=2.31`, `val loss 2.31`, `{"eval_loss": 2.31}`): an
    # eval/val/test name over a bare `loss` over a train name, the last printed within one (see
    # ops.figures; lines over 4096 characters are not searched).
    pattern: str | None = None
    # A candidate worse than the best promoted figure by more than this fraction of it is held back.
    margin: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.05
    # Lower is better (a loss); false for a figure that should rise (an accuracy).
    lower_is_better: bool = True
    # One evaluation may take this long; past it, it is killed and the candidate held back.
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 600.0


class AutoResume(_Section):
    # At most this many automatic resumes (0: off unless `launch --auto-resume N`).
    max: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Wait backoff_s before the first, times backoff_factor after each, capped at backoff_max_s.
    backoff_s: NonNegative = 30.0
    backoff_factor: AtLeastOne = 2.0
    backoff_max_s: NonNegative = 600.0

    def delay_s(self, n: int) -> float:
        """The wait before automatic resume number n (1-based)."""
        return min(self.backoff_max_s, self.backoff_s * self.backoff_factor ** max(0, n - 1))


class Bench(_Section):
    # The verdict's floor for this project's device, in TFLOPS; None: the floor of its class
    # (bench.GPU_FLOORS: 2 for an RTX 3060-class GPU, far above a wedged one; 0.005 for a CPU).
    floor_tflops: NonNegative | None = None
    # How long the timed part runs.
    seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0


class KeeperTimes(_Section):
    # Seconds a keeper stays after its trainer ended with no viewer attached (`--linger` overrides);
    # a status or runs read does not extend it, a control room or `events --follow` does.
    linger_s: NonNegative = 60.0
    # The same for a run whose trainer died (DEAD): its resume needs the keeper, and a person
    # reading an alert comes back later than a minute. A resting keeper costs ~0.1 % of a core.
    dead_linger_s: NonNegative = 3600.0
    # At most this many keepers of dead runs linger at once on this state dir; past it the one
    # lingering longest leaves first (journaled). Each costs ~35 MiB and a little CPU.
    max_dead_lingerers: Annotated[int, msgspec.Meta(ge=1)] = 4
    # Seconds between the probes of a resting keeper (its run ended, nothing in flight): it still
    # sees a leftover process, GPU memory released, a checkpoint written after the end.
    rest_probe_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0


class Log(_Section):
    # Log-line telemetry for uninstrumented trainers: a regex with named groups `step`, `loss`,
    # `lr`, `grad_norm` (without `step`, each matching line is a step). Unset: the built-in
    # recognisers (Hugging Face Trainer, Lightning, nanoGPT; core/logs/logformats).
    pattern: str | None = None


class Slurm(_Section):
    # A Slurm job's task 0 checkpoints, verifies and requeues once the job's time left falls below
    # the run's checkpoint time (measured: save + verification) plus this margin, as the warning
    # signal does (core/slurm/timeleft.py); once per attempt.
    margin_s: NonNegative = 60.0
    # The checkpoint time assumed until one of the run's checkpoints was measured.
    checkpoint_time_s: NonNegative = 60.0
    # The time left is read from slurmctld (`scontrol show job`) at most this often (Slurm 23.02+
    # sets SLURM_JOB_END_TIME, read instead: no query).
    time_left_every_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 10.0
    # false: only the warning signal asks for a checkpoint before the time limit.
    time_left_trigger: bool = True


class Config(_Section):
    # A theme name (themes/*.toml `name`, e.g. "trainroom-light"); None: the control room's
    # default (trainroom-dark, or trainroom-contrast under NO_COLOR).
    theme: str | None = None
    # Lock files the trainer takes (flock/fcntl): STALE_LOCK names their holder from /proc/locks
    # and resume refuses while one is held. Relative to the project dir.
    lock_files: list[str] = []
    # Process names of the VM's or container's host process (e.g. "vmmem", "wslhost"): two of
    # them after a session that was not released is DUPLICATE_TRAINER's host-side twin.
    host_processes: list[str] = []
    checkpoints: Checkpoints = msgspec.field(default_factory=Checkpoints)
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)
    kill: Kill = msgspec.field(default_factory=Kill)
    resume: Resume = msgspec.field(default_factory=Resume)
    auto_resume: AutoResume = msgspec.field(default_factory=AutoResume)
    eval: Eval = msgspec.field(default_factory=Eval)
    log: Log = msgspec.field(default_factory=Log)
    bench: Bench = msgspec.field(default_factory=Bench)
    notify: Notify = msgspec.field(default_factory=Notify)
    hosts: dict[str, Host] = {}
    keys: Keys = msgspec.field(default_factory=Keys)
    journal: JournalPolicy = msgspec.field(default_factory=JournalPolicy)
    keeper: KeeperTimes = msgspec.field(default_factory=KeeperTimes)
    slurm: Slurm = msgspec.field(default_factory=Slurm)

    def resolved(self, project_dir: str | os.PathLike[str]) -> Config:
        """A copy whose relative paths and globs are made absolute against the project dir."""
        base = Path(project_dir)

        def absolute(p: str) -> str:
            return str(base / os.path.expanduser(p))

        ck = self.checkpoints
        return msgspec.structs.replace(
            self,
            lock_files=[absolute(p) for p in self.lock_files],
            checkpoints=msgspec.structs.replace(
                ck,
                root=absolute(ck.root) if ck.root is not None else None,
                watch=[absolute(g) for g in ck.watch],
            ),
        )


def default_state_dir() -> Path:
    return Path(os.environ.get("TRAINROOM_HOME") or Path.home() / ".local" / "state" / "trainroom")


def find_config(
    project_dir: str | os.PathLike[str] | None, state_dir: str | os.PathLike[str] | None
) -> Path | None:
    """The first `trainroom.toml` in the project dir, then the state dir; None when neither has one."""
    for d in (project_dir, state_dir if state_dir is not None else default_state_dir()):
        if d is None:
            continue
        p = Path(d) / CONFIG_NAME
        if p.is_file():
            return p
    return None


def load_config(
    project_dir: str | os.PathLike[str] | None, state_dir: str | os.PathLike[str] | None = None
) -> tuple[Config, Path | None]:
    """The configuration in force and the file it came from (None: built-in defaults).

    Raises ConfigError (one line: file, key path, expected type) for a file that does not
    decode, has an unknown key, or a value of the wrong type or range.
    """
    path = find_config(project_dir, state_dir)
    if path is None:
        return Config(), None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return decode_config(data, path), path


def decode_config(data: bytes | str, path: str | os.PathLike[str] = CONFIG_NAME) -> Config:
    try:
        config = msgspec.toml.decode(data, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_explain(str(exc))}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {_lower_first(str(exc))}") from None
    except RecursionError:  # the TOML parser recurses per nested array or table
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    _check_semantics(config, path)
    return config


# --------------------------------------------------------------------------- error wording

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<where>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]+)`$")


def _explain(message: str) -> str:
    """msgspec's `Expected `float`, got `str` - at `$.thresholds.stall_floor_s`` as
    `thresholds.stall_floor_s: expected float, got str`."""
    m = _AT.match(message)
    what, where = (m.group("what"), m.group("where") or "") if m else (message, "")
    key = where.lstrip(".")
    unknown = _UNKNOWN.match(what)
    if unknown:
        name = unknown.group("key")
        full = f"{key}.{name}" if key else name
        known = _fields_at(key)
        hint = f" (known keys: {', '.join(known)})" if known else ""
        return f"{full}: unknown key{hint}"
    text = _lower_first(what.replace("`", ""))
    return f"{key}: {text}" if key else text


def _fields_at(key: str) -> list[str]:
    """The field names of the Struct at a dotted key path of Config (for the unknown-key hint)."""
    cls: Any = Config
    for part in filter(None, key.split(".")):
        hints = {f.name: f.type for f in msgspec.structs.fields(cls)}
        cls = hints.get(part)
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
            return []
    return [f.encode_name for f in msgspec.structs.fields(cls)]


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:]


def _check_semantics(config: Config, path: str | os.PathLike[str]) -> None:
    """What types alone cannot say: orderings, a compilable regex, known placeholders, key names."""
    check_notify(config.notify, path)
    check_hosts(config.hosts, path)
    check_keys(config.keys, path)
    t = config.thresholds
    if t.disk_warn >= t.disk_critical:
        raise ConfigError(
            f"{path}: thresholds.disk_warn: expected less than thresholds.disk_critical "
            f"({t.disk_critical}), got {t.disk_warn}"
        )
    try:
        if config.log.pattern is not None and re.compile(config.log.pattern).search("") is not None:
            raise ConfigError(f"{path}: log.pattern: expected a pattern an empty line does not match")
    except re.error as exc:
        raise ConfigError(
            f"{path}: log.pattern: expected a regular expression, got one that fails: {exc}"
        ) from None
    for key, command in (("resume.command", config.resume.command), ("eval.command", config.eval.command)):
        if command is not None:
            check_template(key, command, path)
    if config.eval.pattern is not None:
        try:
            re.compile(config.eval.pattern)
        except re.error as exc:
            raise ConfigError(
                f"{path}: eval.pattern: expected a regular expression, got one that fails: {exc}"
            ) from None


def check_template(key: str, command: str, path: str | os.PathLike[str]) -> None:
    """A command template: shell-like words, only the known placeholders, not empty. Braces that
    are no `{name}` (`{}`, JSON) are literal."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(
            f"{path}: {key}: expected a shell-like command, got one that fails: {exc}"
        ) from None
    names = {m.group(1) for w in words for m in _NAMED.finditer(w)}
    unknown = sorted(n for n in names if n not in RESUME_PLACEHOLDERS)
    if unknown:
        allowed = ", ".join("{" + p + "}" for p in RESUME_PLACEHOLDERS)
        raise ConfigError(f"{path}: {key}: expected placeholders among {allowed}, got {{{unknown[0]}}}")
    if not words:
        raise ConfigError(f"{path}: {key}: expected a command, got an empty string")
