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

    [log]
    pattern = 'iter (?P<step>\\d+): loss (?P<loss>\\S+?),'

    [journal]
    snapshot_records = 5000
    full_resolution_h = 24
"""

from __future__ import annotations

import os
import re
import shlex
import string
from pathlib import Path
from typing import Annotated, Any

import msgspec

CONFIG_NAME = "trainroom.toml"
GIB = 1 << 30
MIB = 1 << 20

# Every number is finite and in range: TOML can say nan and inf, and neither is a setting (an upper
# bound makes msgspec refuse both, with the key in its message).
FINITE = 1e12
NonNegative = Annotated[float, msgspec.Meta(ge=0, le=FINITE)]
Positive = Annotated[float, msgspec.Meta(gt=0, le=FINITE)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
AtLeastOne = Annotated[float, msgspec.Meta(ge=1, le=FINITE)]
Count = Annotated[int, msgspec.Meta(ge=1)]

# nanoGPT's training line: `iter 100: loss 2.3456, time 123.45ms, mfu 12.34%`.
DEFAULT_LOG_PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))"
# Placeholders a resume command template may use.
RESUME_PLACEHOLDERS = ("ckpt", "ckpt_dir", "step", "run_id")


class ConfigError(Exception):
    """A config file that cannot be used; str() is one line: file, key path, what was expected."""


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class Checkpoints(_Section):
    # Where the trainer writes checkpoints, relative to the project dir; None: only what the
    # reporter announces and what `watch` matches.
    root: str | None = None
    # How many verified checkpoints prune keeps (the seed's disk guard kept the last two).
    keep: Count = 2
    # Globs, relative to the project dir, that an uninstrumented trainer's checkpoints match.
    watch: list[str] = []


class Thresholds(_Section):
    # STALLED / HUNG: no step for max(stall_floor_s, stall_factor x median step interval).
    stall_floor_s: NonNegative = 10.0
    stall_factor: AtLeastOne = 3.0
    # SLOW: slow_steps consecutive steps each over slow_factor x the median step interval.
    slow_factor: AtLeastOne = 3.0
    slow_steps: Count = 5
    # GHOST_MEMORY: driver-attributed VRAM over ghost_factor x what the allocator reserves.
    ghost_factor: AtLeastOne = 1.5
    # HOST_RAM_LOW: MemAvailable under this (the seed: torch.load fails under 3 GB free).
    host_ram_low_gib: NonNegative = 3.0
    # DISK_HIGH at warn, critical at critical (the seed's disk filled to 94% overnight).
    disk_warn: Fraction = 0.85
    disk_critical: Fraction = 0.94
    # LR_MISMATCH: requested/effective over lr_too_low_ratio (warm-up and decay legitimately
    # run below the requested LR, so this bound is wide), or effective/requested over
    # lr_too_high_ratio (nothing legitimate runs far above it).
    lr_too_low_ratio: AtLeastOne = 50.0
    lr_too_high_ratio: AtLeastOne = 2.0
    # WHITE_MODEL: |loss - ln V| <= white_band x ln V for white_steps steps (relative, because
    # a bf16 loss near 10.8 moves in steps of 0.0625).
    white_band: Fraction = 0.02
    white_steps: Count = 50
    # EXPLODED_START: the first loss of an attempt over this factor x ln V (the seed: 96 vs 10.83).
    exploded_start_factor: AtLeastOne = 2.0
    # REPEAT_DEATH: two attempts that die within this many steps of each other.
    repeat_death_window_steps: Count = 50

    @property
    def host_ram_low_bytes(self) -> int:
        return int(self.host_ram_low_gib * GIB)


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
    # (bench.GPU_FLOORS: 2 for an RTX 3060-class GPU, the seed's figure; 0.005 for a CPU).
    floor_tflops: NonNegative | None = None
    # How long the timed part runs.
    seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0


class Log(_Section):
    # Log-line telemetry for uninstrumented trainers: a regex with a named group `step` and
    # optionally `loss`, `lr`, `tokens`, `grad_norm`.
    pattern: str = DEFAULT_LOG_PATTERN


class JournalPolicy(_Section):
    """How the keeper journals a run that lasts weeks (README: "Runs that last weeks")."""

    # Step and heartbeat records wait in memory up to this long (or batch_rows steps) and are
    # written as one compressed batch. What a keeper killed with -9 can lose from the journal
    # (the live control room saw them); a longer wait packs slow runs tighter.
    batch_s: Annotated[float, msgspec.Meta(ge=0.05, le=60)] = 5.0
    batch_rows: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 4096
    # A folded snapshot of the run every this many records: what a reader of a finished run
    # replays at most after loading the newest snapshot.
    snapshot_records: Annotated[int, msgspec.Meta(ge=1000, le=10_000_000)] = 10000
    # The active journal segment is sealed at this size; a new one begins with the fold of all
    # before it.
    segment_mib: Annotated[float, msgspec.Meta(ge=0.0625, le=4096)] = 64.0
    # Sealed segments keep every step record for this many hours and within this many MiB (the
    # newest first); past either, only their other records stay (the plot keeps its min/max
    # buckets for the whole run either way).
    full_resolution_h: Annotated[float, msgspec.Meta(ge=0, le=87600)] = 72.0
    full_resolution_mib: Annotated[float, msgspec.Meta(ge=0, le=1_048_576)] = 2048.0

    @property
    def segment_bytes(self) -> int:
        return int(self.segment_mib * MIB)

    @property
    def full_resolution_bytes(self) -> int:
        return int(self.full_resolution_mib * MIB)


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
    log: Log = msgspec.field(default_factory=Log)
    bench: Bench = msgspec.field(default_factory=Bench)
    journal: JournalPolicy = msgspec.field(default_factory=JournalPolicy)

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

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


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
    _check_semantics(config, path)
    return config


def resume_argv(template: str, *, ckpt: str, step: int | None = None, run_id: str = "") -> list[str]:
    """The argv of a resumed attempt from the command template, split like a shell would.

    Each placeholder is filled inside its own argv word, so a checkpoint path with spaces stays
    one argument.
    """
    values = {
        "ckpt": ckpt,
        # A promoted checkpoint is a directory (step-000300/); a bare file's directory is its parent.
        "ckpt_dir": ckpt if Path(ckpt).is_dir() else str(Path(ckpt).parent),
        "step": "" if step is None else str(step),
        "run_id": run_id,
    }
    return [word.format(**values) for word in shlex.split(template)]


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
    return [f.name for f in msgspec.structs.fields(cls)]


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:]


def _check_semantics(config: Config, path: str | os.PathLike[str]) -> None:
    """What types alone cannot say: orderings, a compilable regex, known placeholders."""
    t = config.thresholds
    if t.disk_warn >= t.disk_critical:
        raise ConfigError(
            f"{path}: thresholds.disk_warn: expected less than thresholds.disk_critical "
            f"({t.disk_critical}), got {t.disk_warn}"
        )
    try:
        pattern = re.compile(config.log.pattern)
    except re.error as exc:
        raise ConfigError(
            f"{path}: log.pattern: expected a regular expression, got one that fails: {exc}"
        ) from None
    if "step" not in pattern.groupindex:
        raise ConfigError(f"{path}: log.pattern: expected a named group (?P<step>...), got none")
    if config.resume.command is not None:
        try:
            words = shlex.split(config.resume.command)
            names = {name for w in words for _, name, _, _ in string.Formatter().parse(w) if name is not None}
        except ValueError as exc:
            raise ConfigError(
                f"{path}: resume.command: expected a shell-like command, got one that fails: {exc}"
            ) from None
        unknown = sorted(n for n in names if n not in RESUME_PLACEHOLDERS)
        if unknown:
            allowed = ", ".join("{" + p + "}" for p in RESUME_PLACEHOLDERS)
            raise ConfigError(
                f"{path}: resume.command: expected placeholders among {allowed}, got {{{unknown[0]}}}"
            )
        if not words:
            raise ConfigError(f"{path}: resume.command: expected a command, got an empty string")
